"""On a GPU: a fit for a planned (smaller) card starts its compile child once, and gives what the
old start-measure-restart path gives; the fraction's new spelling reaches jaxlib alone.

    python3 benchmarks/check_planned_start.py OUT.json

1. ``fit_batch`` of mlp-tiny for a 256 MiB card at 0.5 on this GPU, counting compile-child starts
   (the real ``CompileChild.start``, counted), and again with the GPU's total hidden so the child
   is started, measured and restarted as before; both answers, limits and fractions.
2. ``jaxfit fit`` in a process whose environment has ``XLA_CLIENT_MEM_FRACTION=0.5`` (XLA's new
   spelling): exit code and the fraction it fitted under (jaxlib refuses a GPU client with both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jaxfit
from jaxfit.fit import batch as batch_mod
from jaxfit.fit import devices
from jaxfit.fit.compiler import CompileChild


def _fit(hide_total: bool) -> dict:
    fractions: list[float] = []
    start = CompileChild.start

    def counted(self: CompileChild):  # type: ignore[no-untyped-def]
        fractions.append(self.mem_fraction)
        return start(self)

    CompileChild.start = counted  # type: ignore[method-assign]
    real_total = devices.cuda_total_bytes
    if hide_total:
        devices.cuda_total_bytes = lambda timeout=120.0: None  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        options = jaxfit.FitOptions(
            mem_fraction=0.5,
            device_memory_bytes=int(os.environ.get("CARD_MIB", "256")) << 20,
            use_cache=False,
            max_batch=1 << 16,
        )
        r = batch_mod.fit_batch(jaxfit.example_source("mlp-tiny"), options)
        return {
            "starts": fractions,
            "batch_size": r.batch_size,
            "peak_bytes": r.peak_bytes,
            "limit_bytes": r.limit_bytes,
            "gpu_total_bytes": r.device.get("gpu_total_bytes"),
            "process_fraction": r.process_fraction,
            "seconds": round(time.perf_counter() - t, 2),
        }
    finally:
        CompileChild.start = start  # type: ignore[method-assign]
        devices.cuda_total_bytes = real_total  # type: ignore[assignment]


def main() -> int:
    out: dict = {"one_start": _fit(False), "restart": _fit(True)}
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_MEM_FRACTION"}
    env["XLA_CLIENT_MEM_FRACTION"] = "0.5"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "fit", "--example", "mlp-tiny", "--no-cache", "--json", "/tmp/new.json"],
        env=env,
        capture_output=True,
        text=True,
    )
    fitted = json.loads(Path("/tmp/new.json").read_text()) if proc.returncode == 0 else {}
    out["new_spelling"] = {
        "exit_code": proc.returncode,
        "mem_fraction": fitted.get("mem_fraction"),
        "limit_bytes": fitted.get("limit_bytes"),
        "stderr_tail": proc.stderr[-600:],
    }
    print(json.dumps(out, indent=1))
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
