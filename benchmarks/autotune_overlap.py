"""Do autotuned compiles overlap when they run in separate processes? (issue 44)

A proof round compiles two batches with autotuning. In one process, threaded, they barely overlap
(docs/guides/facts.md #6: the autotuner contends for the GPU). This measures, on one GPU, the same
autotuned compiles of a built-in example (cold: no compilation cache):

- ``serial``: one process, one batch after another;
- ``threads``: one process, one thread per batch, all at once;
- ``procs``: one process per batch, each lowered first, all compiles started together.

Only the compile is timed (``lowered.compile()``), not the start-up or the tracing. Each program's
peak (``memory_analysis``) is printed too, so the programs can be compared.

    python3 benchmarks/autotune_overlap.py --example gpt-small --fraction 0.3 --batches 19 20 \
        --out $OUT/overlap.json

Results: ``benchmarks/results/h100/overlap/`` (the command in its ``COMMAND.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any


def _lowered(example: str, batches: list[int]) -> dict[int, Any]:
    from jaxfit.fit.sources import build_workload, example_source

    workload = build_workload(example_source(example))
    return {b: workload.lower(b) for b in batches}


def _peak(compiled: Any) -> int:
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def _compile_timed(lowered: Any) -> dict[str, Any]:
    start = time.perf_counter()
    compiled = lowered.compile()
    end = time.perf_counter()
    return {"start": start, "end": end, "seconds": end - start, "peak": _peak(compiled)}


def child(example: str, batch: int, go: str) -> None:
    """One batch in this process: lower, say ``lowered``, wait for the file ``go``, compile, print JSON."""
    lowered = _lowered(example, [batch])[batch]
    print("lowered", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    result = _compile_timed(lowered)
    result["batch"] = batch
    print(json.dumps(result), flush=True)


def in_process(example: str, batches: list[int], threaded: bool) -> dict[str, Any]:
    lowered = _lowered(example, batches)
    results: dict[int, dict[str, Any]] = {}
    start = time.perf_counter()
    if threaded:
        threads = [
            threading.Thread(target=lambda b=b: results.__setitem__(b, _compile_timed(lowered[b]))) for b in batches
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for b in batches:
            results[b] = _compile_timed(lowered[b])
    wall = time.perf_counter() - start
    return {"wall": wall, "compiles": {b: {"seconds": r["seconds"], "peak": r["peak"]} for b, r in results.items()}}


def in_processes(example: str, batches: list[int], tag: str) -> dict[str, Any]:
    go = f"/tmp/jaxfit-overlap-go-{tag}-{os.getpid()}"
    if os.path.exists(go):
        os.remove(go)
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "child", "--example", example, "--batch", str(b), "--go", go],
            stdout=subprocess.PIPE,
            text=True,
        )
        for b in batches
    ]
    for c in children:
        assert c.stdout is not None
        line = c.stdout.readline().strip()
        if line != "lowered":
            raise SystemExit(f"a child did not lower: {line!r}")
    start = time.perf_counter()
    open(go, "w").close()
    results = {}
    for c, b in zip(children, batches):
        out, _ = c.communicate()
        results[b] = json.loads(out.strip().splitlines()[-1])
    os.remove(go)
    wall = max(r["end"] for r in results.values()) - min(r["start"] for r in results.values())
    return {
        "wall": wall,
        "wall_from_go": time.perf_counter() - start,
        "compiles": {b: {"seconds": r["seconds"], "peak": r["peak"]} for b, r in results.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "child", "serial", "threads", "procs"])
    parser.add_argument("--example", default="gpt-small")
    parser.add_argument("--fraction", default="0.3")
    parser.add_argument("--batches", type=int, nargs="+", default=[19, 20])
    parser.add_argument("--batch", type=int)
    parser.add_argument("--go")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "child":
        child(args.example, args.batch, args.go)
        return
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = args.fraction
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    modes = ["procs", "threads", "serial"] if args.mode == "all" else [args.mode]
    report: dict[str, Any] = {"example": args.example, "fraction": args.fraction, "batches": args.batches}
    for mode in modes:
        if mode == "procs":
            # in a child of its own so that this process holds no GPU context while they compile
            report[mode] = in_processes(args.example, args.batches, mode)
        else:
            here = os.path.dirname(os.path.abspath(__file__))
            call = f"a.in_process({args.example!r}, {args.batches!r}, {mode == 'threads'!r})"
            code = f"import json, sys; sys.path.insert(0, {here!r}); import autotune_overlap as a; print(json.dumps({call}))"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            report[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = report[mode]
        compiles = sorted(r["compiles"].items(), key=lambda item: int(item[0]))
        shown = "  ".join(f"batch {b}: {c['seconds']:.1f} s, {c['peak']} B" for b, c in compiles)
        print(f"{mode:<8} wall {r['wall']:6.1f} s  {shown}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
