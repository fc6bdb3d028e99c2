"""Training batches: synthetic sequences a small model can learn, or a memory-mapped token file.

Batches depend only on (seed, step, data-parallel rank, micro-batch index), so a resumed run sees the
same data it would have seen without the interruption.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class Batches:
    def __init__(
        self,
        vocab: int,
        seq_len: int,
        micro_batch: int,
        seed: int,
        token_file: Path | None = None,
        dtype: str = "uint16",
    ):
        self.vocab, self.seq_len, self.micro_batch, self.seed = vocab, seq_len, micro_batch, seed
        self.tokens = None
        if token_file is not None:
            self.tokens = np.memmap(token_file, dtype=np.dtype(dtype), mode="r")
            if len(self.tokens) <= seq_len + 1:
                raise ValueError(
                    f"{token_file} holds {len(self.tokens)} tokens; need more than seq_len+1 ({seq_len + 1})"
                )

    def get(self, step: int, dp_rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels), each (micro_batch, seq_len); labels are the inputs shifted by one."""
        rng = np.random.default_rng([self.seed, step, dp_rank, micro])
        if self.tokens is None:
            # x_t = (x_0 + t * k) mod V with k from a small set: the next token follows from the previous two
            start = rng.integers(0, self.vocab, size=(self.micro_batch, 1))
            stride = rng.integers(1, 8, size=(self.micro_batch, 1))
            seq = (start + stride * np.arange(self.seq_len + 1)) % self.vocab
        else:
            offsets = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.micro_batch)
            seq = np.stack([np.asarray(self.tokens[o : o + self.seq_len + 1], dtype=np.int64) for o in offsets])
            if seq.max() >= self.vocab:
                raise ValueError(f"token id {int(seq.max())} >= vocab {self.vocab}")
        t = torch.as_tensor(seq, dtype=torch.long)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
