"""The dtypes of a training step's tensors under 16-bit training, for the step's request generator
(marp/step_requests.py, issue 29): what autocast casts, which of the built-in model's ops run in 16 or 32 bits,
and the buffers that 16-bit kernels add on the CPU.

What this module owns:

- `StepDtypes`: the bytes per element of the weights (and of their gradients and AdamW's states) and of what the
  matrix products make, for fp32, bf16 autocast over fp32 weights (`bf16-mixed`) and bf16 weights (`bf16-pure`).
- autocast's op lists, as far as the built-in model's ops go (`LOWER_PRECISION`, `FP32`): for CUDA the lists of
  aten/src/ATen/autocast_mode.h as torch 2.13's wheel ships it (`AT_FORALL_LOWER_PRECISION_FP` / `AT_FORALL_FP32` /
  `AT_FORALL_FP32_SET_OPT_DTYPE`), for the CPU `TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)` of
  aten/src/ATen/autocast_mode.cpp (pytorch/pytorch at 008ec6b1; the .cpp is not in the wheel, and the CPU recording
  under torch 2.13 agrees with it for every op of the step). On both devices `linear` and
  `scaled_dot_product_attention` run in the lower precision; every other op of the built-in model runs in its
  inputs' dtype, promoted (fp32 with bf16 gives fp32). CUDA's fp32 list also names `rms_norm`, `layer_norm`, `pow`,
  `rsqrt`, `log_softmax`; in the built-in model their inputs are fp32 already under autocast (the residual stream
  starts at the fp32 embedding, and an fp32 residual plus a bf16 projection is fp32; the loss upcasts the logits),
  so the list casts nothing there and the step's dtypes are the same on both devices.
- autocast's casts (`cached_cast` in autocast_mode.cpp): an fp32 input of a lower-precision op is cast to bf16
  for each op that reads it (a new tensor each time: the norm's output is cast once for q, k and v each); a
  weight (an fp32 leaf that requires grad) is cast once per autocast region and cached. The cache is cleared
  when the outermost region exits, but every cast the built-in model makes is saved by its matrix product, so
  the cache never holds one longer than autograd does. The casts' arguments are evaluated right to left (GCC's
  order for `(*F)(cached_cast(args)...)`): the weight is cast before the input, as the CPU profile shows.
- the buffers of 16-bit kernels: the CPU flash attention kernel's reduced-precision copies of its score block
  (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, torch 2.13: `buf_reduced`, one q-block x kv-block per
  thread forward, two backward), and the CPU's TensorIterator temporaries: a binary op whose inputs differ in
  dtype copies the other one to the common dtype first on the CPU (aten/src/ATen/TensorIterator.cpp
  `compute_types`), where a CUDA kernel casts as it loads.
"""

from __future__ import annotations

from dataclasses import dataclass

# (autocast_mode.cpp / autocast_mode.h, torch 2.13: only the ops the built-in model calls)
LOWER_PRECISION = {
    "cpu": frozenset({"linear", "scaled_dot_product_attention"}),
    "cuda": frozenset({"linear", "scaled_dot_product_attention"}),
}
FP32 = {
    "cpu": frozenset({"cross_entropy_loss", "nll_loss"}),
    "cuda": frozenset({"rms_norm", "layer_norm", "pow", "rsqrt", "log_softmax", "nll_loss", "sum"}),
}


@dataclass(frozen=True)
class StepDtypes:
    """Bytes per element: `param` of the weights, their gradients and AdamW's states; `low` of what a matrix
    product or the attention makes (autocast's lower precision, else the weights' dtype); `autocast`: the forward
    and the loss run under torch.autocast (fp32 weights, bf16 products); `device`: whose kernels ("cpu", "cuda")."""

    param: int = 4
    low: int = 4
    autocast: bool = False
    device: str = "cpu"

    @property
    def sixteen_bit(self) -> bool:
        return self.low < 4


def step_dtypes(precision: str, device: str = "cpu") -> StepDtypes:
    """The step's dtypes for model.yaml's `training.precision`; ValueError for one the generator does not model
    (fp16-mixed: its GradScaler's scaling and unscaling are not generated)."""
    if precision == "fp32":
        return StepDtypes(4, 4, False, device)
    if precision == "bf16-mixed":
        return StepDtypes(4, 2, True, device)
    if precision == "bf16-pure":
        return StepDtypes(2, 2, False, device)
    raise ValueError(f"precision {precision}")


def promoted(a: float, b: float) -> float:
    """Bytes per element of a binary op's output from inputs of `a` and `b` bytes (floating types promote up)."""
    return max(a, b)


def promotion_temporary(dt: StepDtypes, a: float, b: float, elements: int) -> int:
    """Bytes of the temporary a binary op makes for its narrower input (`a`, `b`: its inputs' bytes per element):
    on the CPU the narrower one is copied to the common dtype (TensorIterator's `compute_types`); none on CUDA,
    nor where both agree."""
    if dt.device != "cpu" or a == b:
        return 0
    return int(promoted(a, b) * elements)


def sdpa_reduced_scratch(dt: StepDtypes, q_block: int, kv_block: int, threads: int) -> tuple[int, int]:
    """(forward, backward) bytes of the CPU flash attention kernel's reduced-precision copies of its score block,
    beyond its fp32 buffers: one q-block x kv-block per thread forward, two backward (the probabilities and their
    gradient); none in fp32 or on CUDA (whose kernels keep their blocks on chip)."""
    if dt.device != "cpu" or not dt.sixteen_bit:
        return 0, 0
    block = threads * q_block * kv_block * dt.low
    return block, 2 * block
