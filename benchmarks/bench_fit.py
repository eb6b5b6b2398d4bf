#!/usr/bin/env python3
"""Benchmark ``jaxfit fit`` against the trial search it replaces, on a real GPU.

For each workload, at a fixed memory fraction:

1. **Ground truth by trials** (Lightning ``BatchSizeFinder`` style, docs/guides/facts.md #7): a fresh process
   per trial, started with ``XLA_PYTHON_CLIENT_MEM_FRACTION`` set (preallocation as the user would
   have it, i.e. on), which initialises the real state and runs 3 real train steps at batch B;
   double B until out of memory, then bisect. The largest batch that ran is the true answer.
2. **jaxfit fit**, cold cache (a fresh ``JAXFIT_CACHE_DIR``), as a user would type it.
3. **jaxfit fit again**, same cache: the cached repeat.
4. The true peak at jaxfit's answer (``peak_bytes_in_use`` of the trial at that batch) against
   jaxfit's predicted peak.

Usage (on the GPU machine)::

    python benchmarks/bench_fit.py run --out benchmarks/results/h200 [--only gpt-small-fp32 ...]
    python benchmarks/bench_fit.py table benchmarks/results/h200/*/raw.jsonl

``trial`` is the internal per-trial entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# name -> (example, overrides, fraction). Fractions chosen so each answer is far below max-batch
# and on an H200 (143 GB) trials stay short.
WORKLOADS: dict[str, tuple[str, dict[str, str], float]] = {
    "gpt-small-fp32": ("gpt-small", {}, 0.12),
    "gpt-small-bf16-remat": ("gpt-small", {"dtype": "bfloat16", "remat": "true"}, 0.04),
    "vit-small-fp32": ("vit-small", {}, 0.01),
    "mlp-fp32": ("mlp", {}, 0.008),
    "gpt-tiny-fp32": ("gpt-tiny", {}, 0.01),
}
# The same budgets on an H100 80GB (CUDA total 81,080 MiB vs the H200's 143,160 MiB): the same
# answers, so rows measured on either card describe the same question. The MLP's 0.008 leaves less
# than batch 1 needs on an H100; 0.014 was measured there instead.
H100_FRACTIONS = {
    "gpt-small-fp32": 0.212,
    "gpt-small-bf16-remat": 0.0706,
    "vit-small-fp32": 0.0177,
    "mlp-fp32": 0.014,
    "gpt-tiny-fp32": 0.0177,
}


def gpu_name() -> str:
    """The first GPU's name according to nvidia-smi ("" without one)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except OSError:
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def fraction_for(name: str, device: str, override: float | None) -> float:
    """``--fraction`` when given, else the workload's fraction for this card."""
    if override:
        return override
    return H100_FRACTIONS[name] if "H100" in device else WORKLOADS[name][2]


TRIAL_MARK = "JAXFIT_TRIAL "


def trial_main(args: argparse.Namespace) -> int:
    """One trial: real state, 3 real steps at one batch, in this (fresh) process."""
    import jax

    from jaxfit._probe.jaxfit_compile_server import is_out_of_memory
    from jaxfit.examples import (
        abstract_state,
        init_state,
        load_config,
        make_optimizer,
        make_train_step,
        synthetic_batch,
    )
    from jaxfit.fit.memory import analyse

    overrides = dict(kv.split("=", 1) for kv in args.set)
    cfg = load_config(args.example, overrides)
    record: dict = {"batch": args.batch, "ok": False}
    start = time.perf_counter()
    try:
        tx = make_optimizer(cfg)
        graphdef, _ = abstract_state(cfg, tx)
        step = jax.jit(make_train_step(cfg, graphdef, tx), donate_argnums=0)
        state = jax.jit(lambda key: init_state(cfg, key, tx)[1])(jax.random.key(0))
        batch = synthetic_batch(cfg, args.batch, jax.random.key(1))
        compiled = step.lower(state, batch).compile()
        record.update(analyse(compiled).to_dict())
        for _ in range(args.steps):
            state, metrics = compiled(state, batch)
        loss = float(jax.block_until_ready(metrics["loss"]))
        stats = jax.devices()[0].memory_stats() or {}
        record.update(
            ok=True, loss=loss, peak_bytes_in_use=stats.get("peak_bytes_in_use"), bytes_limit=stats.get("bytes_limit")
        )
    except Exception as e:  # the trial's answer, not a crash of the benchmark
        message = f"{type(e).__name__}: {e}"
        record.update(ok=False, oom=is_out_of_memory(message), error=message.splitlines()[0][:300])
    record["wall_s"] = round(time.perf_counter() - start, 3)
    print(TRIAL_MARK + json.dumps(record), flush=True)
    return 0


def run_trial(example: str, overrides: dict[str, str], fraction: float, batch: int) -> dict:
    """Run one trial in a fresh process, as a user would."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=str(fraction), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    cmd = [sys.executable, __file__, "trial", "--example", example, "--batch", str(batch)]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith(TRIAL_MARK):
            record = json.loads(line[len(TRIAL_MARK) :])
            record["process_wall_s"] = round(wall, 3)
            return record
    # A crash (not a clean OOM exception) counts as a failed trial; keep its tail for the record.
    tail = (proc.stderr or "").strip().splitlines()[-3:]
    return {
        "batch": batch,
        "ok": False,
        "oom": "RESOURCE_EXHAUSTED" in proc.stderr,
        "crash": True,
        "error": " | ".join(tail)[:300],
        "process_wall_s": round(wall, 3),
    }


def trial_search(example: str, overrides: dict[str, str], fraction: float, log, journal: Path | None = None) -> dict:
    """Double until a trial fails, then bisect (one fresh process per trial).

    Each trial is also appended to ``journal`` as it ends, so a search cut short keeps its trials.
    """
    from jaxfit.fit.search import Grid, doubling_bisection

    trials: list[dict] = []

    def evaluate(b: int) -> float:
        record = run_trial(example, overrides, fraction, b)
        trials.append(record)
        if journal is not None:
            with journal.open("a") as f:
                f.write(json.dumps(dict(record, example=example, overrides=overrides, mem_fraction=fraction)) + "\n")
        log(f"    trial batch {b}: {'ok' if record['ok'] else 'FAILED'} ({record['process_wall_s']:.1f} s)")
        return -1.0 if record["ok"] else 1.0

    start = time.perf_counter()
    result = doubling_bisection(evaluate, Grid(1, 4096))
    return {
        "true_max": result.answer,
        "trials": len(trials),
        "trial_wall_s": round(time.perf_counter() - start, 3),
        "trial_records": trials,
    }


def jaxfit_fit(example: str, overrides: dict[str, str], fraction: float, cache_dir: str, out: Path) -> dict:
    """``jaxfit fit`` as a user types it; wall time includes the child process start."""
    cmd = [
        sys.executable,
        "-m",
        "jaxfit.cli",
        "fit",
        "--example",
        example,
        "--mem-fraction",
        str(fraction),
        "--json",
        str(out),
        "--quiet",
    ]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    env = dict(os.environ, JAXFIT_CACHE_DIR=cache_dir)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"ok": False, "error": proc.stderr.strip()[-500:], "wall_s": round(wall, 3)}
    result = json.loads(out.read_text())
    return {"ok": True, "wall_s": round(wall, 3), "result": result}


def run_main(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "raw.jsonl"
    names = args.only or list(WORKLOADS)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    device = gpu_name()
    for name in names:
        example, overrides, _ = WORKLOADS[name]
        fraction = fraction_for(name, device, args.fraction)
        log(f"== {name}: {example} {overrides} at fraction {fraction} on {device or 'no GPU'}")
        record = {
            "workload": name,
            "example": example,
            "overrides": overrides,
            "mem_fraction": fraction,
            "device": device,
        }
        if not args.trials_only:
            with tempfile.TemporaryDirectory() as cache_dir:
                cold = jaxfit_fit(example, overrides, fraction, cache_dir, out_dir / f"{name}.fit.json")
                log(
                    f"  jaxfit cold: {cold.get('result', {}).get('batch_size')} in {cold['wall_s']:.1f} s"
                    + ("" if cold["ok"] else f": {cold['error']}")
                )
                warm = jaxfit_fit(example, overrides, fraction, cache_dir, out_dir / f"{name}.fit-cached.json")
                log(f"  jaxfit cached: {warm['wall_s']:.2f} s")
            record.update(jaxfit_cold=cold, jaxfit_cached={k: v for k, v in warm.items() if k != "result"})
        if not args.skip_trials:
            truth = trial_search(example, overrides, fraction, log, out_dir / "trials.jsonl")
            record.update(truth)
            log(f"  trials: true max {truth['true_max']} after {truth['trials']} trials, {truth['trial_wall_s']:.1f} s")
        cold = record.get("jaxfit_cold", {})
        if cold.get("ok") and not args.skip_trials:
            answer = cold["result"]["batch_size"]
            at_answer = [t for t in record.get("trial_records", []) if t["batch"] == answer]
            record["at_answer"] = at_answer[0] if at_answer else run_trial(example, overrides, fraction, answer)
        with raw.open("a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def table_main(args: argparse.Namespace) -> int:
    records = [json.loads(line) for raw in args.raw for line in Path(raw).read_text().splitlines() if line.strip()]
    # Per workload (and the fraction of its latest record): jaxfit from the latest record that ran
    # it, the ground truth from the latest that ran the trials (they do not depend on jaxfit's code),
    # so jaxfit-only (--skip-trials) and trials-only (--trials-only) runs combine.
    rows = []
    for name in dict.fromkeys(r["workload"] for r in records):
        fraction = [r for r in records if r["workload"] == name][-1]["mem_fraction"]
        mine = [r for r in records if r["workload"] == name and r["mem_fraction"] == fraction]
        fits = [r for r in mine if "jaxfit_cold" in r]
        if not fits:
            continue
        row = dict(fits[-1])
        truth = [r for r in mine if "true_max" in r]
        if truth:
            row.update({k: truth[-1][k] for k in ("true_max", "trials", "trial_wall_s")})
            if row["jaxfit_cold"].get("ok") and "at_answer" not in row:
                answer = row["jaxfit_cold"]["result"]["batch_size"]
                at = [t for t in truth[-1].get("trial_records", []) if t["batch"] == answer]
                row["at_answer"] = at[0] if at else {}
        rows.append(row)
    print(
        "| workload | fraction | budget MiB | true max (trials) | trials | trial s | jaxfit answer | compiles | rounds "
        "| jaxfit s | jaxfit / trials | cached s | predicted peak MiB | measured peak MiB | OOM at answer | device |"
    )
    print("|" + " --- |" * 16)
    for r in rows:
        cold = r["jaxfit_cold"]
        res = cold.get("result", {})
        at = r.get("at_answer", {})
        ratio = (cold["wall_s"] / r["trial_wall_s"]) if r.get("trial_wall_s") and cold.get("ok") else None
        print(
            f"| {r['workload']} | {r['mem_fraction']} | {_mib(res.get('budget_bytes'))} | {r.get('true_max', '-')} "
            f"| {r.get('trials', '-')} | {r.get('trial_wall_s', '-')} | {res.get('batch_size', 'error')} "
            f"| {res.get('compiles', '-')} | {res.get('rounds', '-')} | {cold['wall_s']:.1f} "
            f"| {f'{ratio:.3f}' if ratio else '-'} | {r['jaxfit_cached']['wall_s']:.2f} "
            f"| {_mib(res.get('peak_bytes'))} | {_mib(at.get('peak_bytes_in_use'))} "
            f"| {'-' if not at else 'no' if at.get('ok') else 'YES'} | {r.get('device', 'NVIDIA H200')} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run the benchmark (GPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="*", choices=list(WORKLOADS))
    p.add_argument("--skip-trials", action="store_true", help="time jaxfit only (no ground truth)")
    p.add_argument("--trials-only", action="store_true", help="the ground truth only (no jaxfit)")
    p.add_argument(
        "--fraction",
        type=float,
        help="override the workloads' fractions (default: the H200's, or the same budgets on an H100)",
    )
    p = sub.add_parser("table", help="render raw.jsonl files as a markdown table (later records win)")
    p.add_argument("raw", nargs="+")
    p = sub.add_parser("trial", help="internal: one trial in this process")
    p.add_argument("--example", required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    return {"run": run_main, "table": table_main, "trial": trial_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
