"""The memory breakdown of one plan as a picture: a stacked bar per pipeline stage, in the terminal
(`frenzy-slurm memory --plan ...`) and as an image file (`--plot FILE`, matplotlib, the `plot` extra).

Both draw the parts of `StageMemory` at its peak moment, in the order of `marp.memory.COMPONENTS`, on
one scale for all stages, with the usable memory of a GPU type marked when one is given.
"""

from __future__ import annotations

from pathlib import Path

import click

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.memory import COMPONENTS, MemoryEstimate

# one glyph and one colour per part, so the bar reads without colour too (pipes, logs)
_GLYPH = {
    "weights": "█",
    "gradients": "▓",
    "optimizer": "▒",
    "activations": "░",
    "logits": "≡",
    "buffers": ":",
    "overhead": "·",
}
_TERM_COLOUR = {
    "weights": "blue",
    "gradients": "magenta",
    "optimizer": "yellow",
    "activations": "green",
    "logits": "cyan",
    "buffers": "red",
    "overhead": "white",
}
_PLOT_COLOUR = {
    "weights": "#4c72b0",
    "gradients": "#8172b2",
    "optimizer": "#ccb974",
    "activations": "#55a868",
    "logits": "#64b5cd",
    "buffers": "#c44e52",
    "overhead": "#8c8c8c",
}


def terminal_bars(est: MemoryEstimate, width: int = 60, usable_gib: float | None = None, colour: bool = True) -> str:
    """One line per stage: `stage 0 |███▓▓▒▒▒░░░≡:·     | 61.2 GiB`, then the legend."""
    top = max([s.peak for s in est.stages] + [usable_gib * GiB if usable_gib else 0.0]) or 1.0
    lines = []
    for s in est.stages:
        cells, used = [], 0
        filled = 0.0
        for c in COMPONENTS:
            filled += getattr(s, c) / top * width
            n = round(filled) - used  # cumulative rounding: the bar's length is exact to one cell
            if n > 0:
                text = _GLYPH[c] * n
                cells.append(click.style(text, fg=_TERM_COLOUR[c]) if colour else text)
                used += n
        pad = width - used
        mark = ""
        if usable_gib:
            cap = min(width, round(usable_gib * GiB / top * width))
            bar_pad = [" "] * max(pad, 0)
            if cap > used and cap - used - 1 < len(bar_pad):
                bar_pad[cap - used - 1] = "|"
            mark = "".join(bar_pad)
        else:
            mark = " " * max(pad, 0)
        lines.append(f"stage {s.stage:<2} {''.join(cells)}{mark} {s.peak / GiB:7.2f} GiB ({s.phase})")
    legend = "  ".join(
        (click.style(_GLYPH[c], fg=_TERM_COLOUR[c]) if colour else _GLYPH[c]) + f" {c}" for c in COMPONENTS
    )
    lines.append(legend + (f"  | usable {usable_gib:.1f} GiB" if usable_gib else ""))
    return "\n".join(lines)


def plot_breakdown(est: MemoryEstimate, path: Path, title: str, usable_gib: float | None = None) -> None:
    """Stacked horizontal bars (GiB) per stage into `path` (format from its suffix: png, svg, pdf)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a login node
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'frenzy-slurm[plot]'") from None
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.5 * len(est.stages)))
    labels = [f"stage {s.stage}" for s in est.stages]
    left = [0.0] * len(est.stages)
    for c in COMPONENTS:
        vals = [getattr(s, c) / GiB for s in est.stages]
        ax.barh(labels, vals, left=left, color=_PLOT_COLOUR[c], label=c, height=0.6)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    for y, s in enumerate(est.stages):
        ax.text(left[y], y, f" {s.peak / GiB:.2f} GiB", va="center", fontsize=8)
    if usable_gib:
        ax.axvline(usable_gib, color="black", linestyle="--", linewidth=1, label=f"usable {usable_gib:.1f} GiB")
    ax.invert_yaxis()
    ax.set_xlabel(f"GiB per GPU ({est.metric})")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    import io

    try:
        image = io.BytesIO()  # the format from the suffix, as savefig(path) would; written never through a link
        fig.savefig(image, dpi=120, bbox_inches="tight", format=Path(path).suffix.lstrip(".").lower() or None)
        write_atomic(Path(path), image.getvalue(), mode=0o644)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--plot {path}: cannot write the image ({exc}); use a .png, .svg or .pdf path in a writable directory"
        ) from None
    finally:
        plt.close(fig)
