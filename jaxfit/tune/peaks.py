"""Peak FLOP/s per device kind, for MFU (model FLOPs utilisation). Dense (no sparsity) vendor
datasheet numbers, SXM parts; ``--peak-tflops`` overrides. A float32 matrix product on these GPUs
runs on TF32 tensor cores by default in XLA, so float32 uses the TF32 peak."""

from __future__ import annotations

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989.4, "float32": 494.7},
    "H100": {"bfloat16": 989.4, "float32": 494.7},
    "A100": {"bfloat16": 312.0, "float32": 156.0},
    "L40S": {"bfloat16": 362.1, "float32": 183.0},
    "RTX 6000 Ada": {"bfloat16": 364.2, "float32": 182.1},
}
"""TFLOP/s by a substring of the device kind JAX reports (``NVIDIA H100 80GB HBM3``)."""


def peak_flops(device_kind: str, dtype: str, override_tflops: float | None = None) -> tuple[float | None, str]:
    """``(FLOP/s, where it comes from)`` for ``device_kind`` computing in ``dtype``; None when unknown."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    for name, peaks in PEAK_TFLOPS.items():
        if name.lower() in device_kind.lower() and dtype in peaks:
            return peaks[dtype] * 1e12, f"{name} {dtype} datasheet"
    return None, f"no peak known for {device_kind!r} (pass --peak-tflops)"
