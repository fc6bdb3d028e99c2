"""Units the whole package shares, written once: bytes per GiB, FLOP/s per TFLOP/s; a size as it is printed.

Binary units throughout, as torch, NVML and Slurm report memory (`--mem=4G` is 4 GiB to Slurm). This module
imports nothing, so the in-job runtime, the login-node stages and the tools all use it without pulling in any
other part of the package (or torch).
"""

GiB = float(1 << 30)  # bytes in a gibibyte (2**30); a float, since every use divides or scales a measurement
TFLOPS = 1e12  # FLOP/s in one TFLOP/s (the GPU catalog's peak rates are in TFLOP/s)


def fmt_gib(value: float) -> str:
    """Binary size with 3 significant digits: `38G`, `5.84M` (MiB below 0.1 GiB, for tiny test models)."""
    if value < 0.1:
        return f"{value * 1024:.3g}M"
    return f"{value:.3g}G"
