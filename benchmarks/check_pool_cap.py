"""Is ``XLA_PYTHON_CLIENT_MEM_FRACTION`` a hard cap on this GPU stack? (issue 22, item 3)

Every answer jaxfit gives assumes that a process started under fraction ``f`` can hold at most
``f x`` the GPU's memory: packing runs side by side and pinning both rely on it. JAX's docs describe
pools that may grow and XLA renames the variable, so this measures what the installed jax does.
For each environment below a fresh process reads its allocator's ``bytes_limit`` and then
allocates 256 MiB arrays, keeping them, until an allocation fails: the cap holds when what it
could hold is at most ``bytes_limit``, and ``bytes_limit`` is ``f x`` the GPU's total.

    python benchmarks/check_pool_cap.py OUT.json      # on the GPU machine; about a minute

Writes one JSON object per environment (``OUT.json``, a list) and prints a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
out = {}
try:
    import jax, jax.numpy as jnp
    out["jax"] = jax.__version__
    d = jax.devices()[0]
    out["device"] = d.device_kind
    stats = d.memory_stats() or {}
    out["bytes_limit"] = stats.get("bytes_limit")
    held, chunk = [], 64 << 20  # float32 elements: 256 MiB
    try:
        while d.platform == "gpu" and len(held) < 2000:  # a CPU has no pool: nothing to fill
            array = jnp.zeros((chunk,), jnp.float32)
            array.block_until_ready()
            held.append(array)  # (the first run counted the array whose allocation failed too)
    except Exception as e:
        out["stopped_by"] = (type(e).__name__ + ": " + str(e).strip().splitlines()[0])[:200]
    out["held_bytes"] = len(held) * chunk * 4
    out["peak_bytes_in_use"] = (d.memory_stats() or {}).get("peak_bytes_in_use")
except Exception as e:
    out["error"] = (type(e).__name__ + ": " + str(e).strip().splitlines()[0])[:300]
print("RESULT " + json.dumps(out), flush=True)
"""

FRACTION = "0.3"
CASES: list[tuple[str, dict[str, str]]] = [
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION}),
    (
        "XLA_PYTHON_CLIENT_MEM_FRACTION, PREALLOCATE=false",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    ),
    ("XLA_CLIENT_MEM_FRACTION (new spelling)", {"XLA_CLIENT_MEM_FRACTION": FRACTION}),
    (
        "both spellings",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_CLIENT_MEM_FRACTION": FRACTION},
    ),
    ("no fraction (the default)", {}),
    (
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
    ),
    (  # jaxlib's other allocators (jax-ml/jax#39145 lists default, platform, bfc, cuda_async, vmm):
        # not measured yet (added after section 16's run)
        "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"},
    ),
    (
        "XLA_PYTHON_CLIENT_ALLOCATOR=vmm",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"},
    ),
    (
        "XLA_FLAGS=--xla_gpu_memory_fraction_policy=fixed",
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": FRACTION, "XLA_FLAGS": "--xla_gpu_memory_fraction_policy=fixed"},
    ),
]
VARIABLES = (
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "XLA_FLAGS",
)


def total_bytes() -> int | None:
    """The GPU's memory as CUDA reports it (nvidia-smi's total, MiB)."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return int(text.split()[0]) << 20
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def main() -> int:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "pool-cap.json"
    rows = []
    smi_total = total_bytes()
    for name, extra in CASES:
        env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        env.update(extra)
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=240)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            got = json.loads(line[7:]) if line else {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
            got["exit_code"] = proc.returncode
        except subprocess.TimeoutExpired:
            got = {"error": "timed out"}
        got.update(case=name, env=extra, smi_total_bytes=smi_total)
        rows.append(got)
        limit, held = got.get("bytes_limit"), got.get("held_bytes")
        print(
            f"{name}: bytes_limit={limit} held={held} "
            f"cap_holds={None if limit is None or held is None else held <= limit} "
            f"{got.get('stopped_by') or got.get('error') or ''}",
            flush=True,
        )
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
