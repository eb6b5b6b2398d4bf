#!/usr/bin/env python3
"""Where does the time of one ``jaxfit fit`` compile go, and which ways of compiling are cheaper?

``jaxfit fit`` spends nearly all its wall time compiling. This measures, for one workload under one
memory fraction (the process's own ``XLA_PYTHON_CLIENT_MEM_FRACTION``; preallocation off, as the
compile child runs), each on batches not compiled before in the process (XLA keeps autotuning
results in memory):

- ``lower``: tracing + lowering one batch (the compile server lowers under a lock);
- ``untuned`` / ``tuned``: one compile alone, autotuning off (level 0) / on (XLA's default);
- ``tuned-repeat``: the same batch as ``tuned`` again (autotuning answered from XLA's in-memory
  cache: the cost of a tuned compile without the autotuning);
- ``untuned-fastcg``: autotuning off and cheap code generation (LLVM and ptxas optimisations off),
  which should not move buffers: its peaks are compared with ``untuned``;
- ``tuned-threads-4`` / ``untuned-threads-4`` / ``untuned-fastcg-threads-4``: four batches in four
  threads of this process (what the compile server does);
- ``tuned-procs-4``: four batches in four fresh processes at once (compile time measured inside each).

Usage (GPU machine)::

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 python benchmarks/bench_compile_modes.py --example gpt-small --batch 12 --out r.jsonl
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

FAST_CODEGEN = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_gpu_disable_gpuasm_optimizations": True,
}


def options_for(mode: str) -> dict:
    opts: dict = {}
    if mode == "tuned-repeat":
        # The default level, spelled out: jax's own executable cache misses (other options),
        # XLA's in-memory autotuning results hit.
        opts["xla_gpu_autotune_level"] = 4
    if mode.startswith("untuned"):
        opts["xla_gpu_autotune_level"] = 0
    if "fastcg" in mode:
        opts.update(FAST_CODEGEN)
    return opts


def peak_of(compiled) -> int:
    ma = compiled.memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes)


def build(example: str, sets: list[str]):
    from jaxfit.fit.sources import build_workload, example_source

    return build_workload(example_source(example, dict(kv.split("=", 1) for kv in sets)))


def compile_one(workload, batch: int, mode: str, lowered=None) -> dict:
    t0 = time.perf_counter()
    lowered = lowered or workload.lower(batch)
    t1 = time.perf_counter()
    opts = options_for(mode)
    compiled = lowered.compile(compiler_options=opts) if opts else lowered.compile()
    t2 = time.perf_counter()
    return {"batch": batch, "lower_s": round(t1 - t0, 3), "compile_s": round(t2 - t1, 3), "peak": peak_of(compiled)}


def one_main(args) -> int:
    """A fresh process that compiles one batch (for ``tuned-procs-4``)."""
    t0 = time.perf_counter()
    workload = build(args.example, args.set)
    import jax

    jax.devices()
    ready = time.perf_counter() - t0
    row = compile_one(workload, args.batch, args.mode)
    row["startup_s"] = round(ready, 3)
    print("ROW " + json.dumps(row), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--example", required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--batch", type=int, required=True, help="the first batch; each mode uses fresh ones above it")
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--modes",
        default="lower,untuned,tuned,tuned-repeat,untuned-fastcg,untuned-threads-4,"
        "untuned-fastcg-threads-4,tuned-threads-4,tuned-procs-4",
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="tuned", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one_main(args)

    t0 = time.perf_counter()
    workload = build(args.example, args.set)
    import jax

    device = jax.devices()[0]
    base = {
        "example": args.example,
        "set": args.set,
        "device": device.device_kind,
        "fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "jax": jax.__version__,
        "bytes_limit": (device.memory_stats() or {}).get("bytes_limit"),
    }
    print(json.dumps(dict(base, mode="startup", seconds=round(time.perf_counter() - t0, 3))), flush=True)
    next_batch = args.batch
    last_tuned = None

    def fresh(n: int) -> list[int]:
        nonlocal next_batch
        out = list(range(next_batch, next_batch + n))
        next_batch += n
        return out

    def record(mode: str, rows: list[dict], wall: float) -> None:
        line = dict(base, mode=mode, wall_s=round(wall, 3), rows=rows)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")

    for mode in args.modes.split(","):
        start = time.perf_counter()
        if mode == "lower":
            rows = [
                {"batch": b, "lower_s": round(_timed(lambda: workload.lower(b)), 3)}
                for b in (args.batch, args.batch + 1)
            ]
        elif mode == "tuned-repeat":
            if last_tuned is None:
                continue
            rows = [compile_one(workload, last_tuned, "tuned-repeat")]
        elif mode.endswith("-threads-4"):
            kind = mode[: -len("-threads-4")]
            batches = fresh(4)
            lowered = {b: workload.lower(b) for b in batches}  # lower first: compile time only
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                rows = list(pool.map(lambda b: compile_one(workload, b, kind, lowered[b]), batches))
        elif mode == "tuned-procs-4":
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        "--example",
                        args.example,
                        *sum((["--set", s] for s in args.set), []),
                        "--batch",
                        str(b),
                        "--mode",
                        "tuned",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for b in fresh(4)
            ]
            rows = []
            for proc in procs:
                out, _ = proc.communicate()
                rows += [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
        else:
            (b,) = fresh(1)
            rows = [compile_one(workload, b, mode)]
            if mode == "tuned":
                last_tuned = b
        record(mode, rows, time.perf_counter() - start)
    return 0


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
