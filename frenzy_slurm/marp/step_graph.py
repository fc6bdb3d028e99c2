"""The forward graph a training step's requests are generated from (marp/step_requests.py, issue 29).

What this module owns: `Op`, one forward op with what autograd does with it (what its backward function saves,
which inputs get gradients, its parameters' gradients, its workspaces), and `Graph`, the step's ops in order with
each tensor's size, block and phase, the views' bases, the blocks that are recomputed, and which tensors require
grad (an op none of whose inputs requires grad and that has no trainable weight makes no backward). The model
codes' op lists build a Graph (marp/step_frenzy.py for the built-in model, step_requests.py's `_hf_graph` for
transformers' Llama); step_requests.py walks it into requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SELF = "@out"  # in an op's `saves`: its own output


@dataclass(frozen=True)
class Op:
    """One forward op: reads `inputs`, makes `out` (`size` bytes). `saves`: what its backward function keeps;
    `grads`: the inputs it gives a gradient to; `reduce`: inputs broadcast into the output, whose gradient is an
    output-sized product summed down (a temporary); `params`: the parameter gradients it makes (bytes); `scratch`:
    a workspace it allocates and frees while it runs (forward, backward)."""

    name: str
    inputs: tuple[str, ...]
    out: str
    size: int
    saves: tuple[str, ...] = ()
    grads: tuple[str, ...] = ()
    reduce: tuple[str, ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    scratch: tuple[int, int] = (0, 0)
    holds: tuple[str, ...] = ()  # tensors the Python code still binds until this op has run (e.g. `logits`)
    elementwise: bool = False  # its parameter gradients are reductions of output-sized products, after its input's
    params_last: bool = False  # its parameter gradients are made after its input's
    passthrough: tuple[str, ...] = ()  # inputs its backward hands the output's gradient to as it is (an add)
    view: bool = False  # its output shares its first input's storage: nothing is allocated, the input stays alive
    view_grads: bool = False  # the input gradients it makes are views (a linear on 3-d input: mm on a flattening)
    bscratch: int = 1  # how many backward workspaces of `scratch[1]` bytes it makes
    bscratch_last: bool = False  # its backward makes its workspace after its input gradients (a kernel's buffer)
    scratch2: tuple[int, int] = (0, 0)  # a second workspace (forward, backward), made after the first, gone before it
    unwanted: tuple[str, ...] = ()  # inputs not requiring grad whose gradient its kernel makes anyway, then drops


@dataclass
class Graph:
    """The step's forward ops with each tensor's size and block."""

    ops: list[Op] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    layer_of: dict[str, int] = field(default_factory=dict)
    phase_of: dict[str, str] = field(default_factory=dict)  # op name -> forward phase
    base: dict[str, str] = field(default_factory=dict)  # view -> the tensor whose storage it shares
    checkpointed: dict[str, int] = field(default_factory=dict)  # op -> its block, where the block is recomputed
    checkpoint: bool = False  # the blocks' ops made now are recomputed in backward
    held: tuple[str, ...] = ()  # what the training loop holds from the forward into the backward's start
    layer: int = -1
    phase: str = "forward"
    trainable: bool = True  # the parameters of the ops made now get gradients (False: LoRA's frozen base)
    rg: set[str] = field(default_factory=set)  # the tensors that require grad

    def storage(self, k: str) -> str:
        """The tensor whose storage `k` is (itself, or a view's base)."""
        return self.base.get(k, k)

    def op(
        self,
        name: str,
        inputs: Sequence[str],
        size: float,
        *,
        saves: Sequence[str] = (),
        grads: Sequence[str] = (),
        reduce: Sequence[str] = (),
        params: Sequence[tuple[str, float]] = (),
        scratch: tuple[float, float] = (0, 0),
        holds: Sequence[str] = (),
        elementwise: bool = False,
        params_last: bool = False,
        passthrough: Sequence[str] = (),
        view: bool = False,
        view_grads: bool = False,
        bscratch: int = 1,
        bscratch_last: bool = False,
        scratch2: tuple[float, float] = (0, 0),
        trainable: bool | None = None,
        all_grads: bool = False,
    ) -> str:
        """Appends an op of the current block and phase; returns its output's key (`SELF` in `saves` names it).
        Parameter names are made the op's own (`name@op`), unless they name another op's already. `trainable`
        (default the graph's): its parameters get gradients. An op none of whose inputs requires grad and which has
        no trainable parameter is not recorded by autograd: it saves nothing and has no backward; one that is
        gives gradients only to its inputs that require grad; `all_grads`: its backward kernel makes every input's
        gradient, wanted or not. (What an op saves only for its parameters' gradients the caller leaves out where
        they are frozen.)"""
        out = f"{name}.L{self.layer}"
        while out in self.sizes:  # (a second norm in the block)
            out += "'"
        params = params if (self.trainable if trainable is None else trainable) else ()
        if any(k in self.rg for k in inputs) or params:
            self.rg.add(out)
        else:
            saves, reduce, passthrough = (), (), ()
        unwanted = tuple(k for k in grads if k not in self.rg) if all_grads else ()
        grads = [k for k in grads if k in self.rg or k in unwanted]
        self.sizes[out] = int(size)
        self.layer_of[out] = self.layer
        self.phase_of[out] = self.phase
        op = Op(
            name=out,
            inputs=tuple(inputs),
            out=out,
            size=int(size),
            saves=tuple(out if k == SELF else k for k in saves),
            grads=tuple(grads),
            reduce=tuple(reduce),
            params=tuple((p if "@" in p else f"{p}@{out}", int(b)) for p, b in params),
            scratch=(int(scratch[0]), int(scratch[1])),
            holds=tuple(holds),
            elementwise=elementwise,
            params_last=params_last or elementwise,
            passthrough=tuple(passthrough),
            view=view,
            view_grads=view_grads,
            bscratch=bscratch,
            bscratch_last=bscratch_last,
            scratch2=(int(scratch2[0]), int(scratch2[1])),
            unwanted=unwanted,
        )
        self.ops.append(op)
        if self.checkpoint:
            self.checkpointed[out] = self.layer
        if view:
            self.base[out] = self.storage(inputs[0])
        return out
