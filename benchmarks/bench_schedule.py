#!/usr/bin/env python3
"""Benchmark ``jaxfit schedule`` on a real GPU: a packed queue against the same runs one at a time.

The queue (written by this script, :data:`EXPERIMENTS`) mixes five ``scripts/train.py`` configs of
different sizes and every kind of queue entry: batch given and fraction ``auto``, batch ``auto``
under a given fraction with a global batch, both given, both ``auto`` (an equal share).

Steps (on the GPU machine, from the repo root)::

    python benchmarks/bench_schedule.py plan --out DIR        # jaxfit schedule --dry-run (the fits)
    python benchmarks/bench_schedule.py packed --out DIR      # jaxfit schedule: the runs side by side
    python benchmarks/bench_schedule.py sequential --out DIR  # the same commands, fractions, batches, one at a time
    python benchmarks/bench_schedule.py table DIR             # the results table (markdown)

``packed`` runs the plan that ``plan`` wrote (``jaxfit schedule --plan DIR/plan.json``), so the
fits (minutes: each probes ``scripts/train.py``) are not repeated; without one it plans itself. Makespan is first start to last end of the
runs (planning excluded and reported on its own); the sequential time is the sum of each run's
wall time alone. Peaks: each run prints ``peak_bytes_in_use`` (JAX's allocator) at its end, and the
scheduler's monitor samples NVML every second (per GPU and per process).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxfit.schedule.monitor import gpu_peaks  # noqa: E402
from jaxfit.schedule.state import StateStore  # noqa: E402

TRAIN = [sys.executable, "scripts/train.py"]
COMMON = ["--no-wandb-enabled", "--overwrite", "--checkpoint-base-dir=/tmp/jaxfit-bench-ck", "--save-interval=100000"]

EXPERIMENTS: list[dict] = [
    {"name": "gpt-small-fp32", "config": "gpt_small", "steps": 200, "batch": 8, "fraction": "auto", "priority": 1},
    {
        "name": "gpt-small-bf16-remat",
        "config": "gpt_small_bf16_remat",
        "steps": 150,
        "batch": "auto",
        "fraction": 0.06,
        "global_batch": 32,
    },
    {"name": "vit-small", "config": "vit_small", "steps": 200, "batch": 64, "fraction": 0.1},
    {"name": "gpt-tiny-share", "config": "debug", "steps": 3000, "batch": "auto", "fraction": "auto"},
    {"name": "vit-tiny", "config": "debug_vit", "steps": 3000, "batch": 256, "fraction": "auto"},
]
MAX_BATCH = 256


SMOKE = os.environ.get("BENCH_SMOKE_DEVICE_MEMORY")
"""Set (e.g. 80GiB) for a CPU smoke test of this script: logical GPUs of that size, 1% of the steps."""


def _logical() -> list[str]:
    return ["--gpus", "1", "--device-memory", SMOKE] if SMOKE else []


def write_queue(out: Path) -> Path:
    import yaml

    experiments = []
    for e in EXPERIMENTS:
        steps = max(2, e["steps"] // 100) if SMOKE else e["steps"]
        command = [
            *TRAIN,
            e["config"],
            f"--exp-name={e['name']}",
            f"--num-train-steps={steps}",
            "--log-interval=50",
            *COMMON,
        ]
        entry = {
            "name": e["name"],
            "command": command,
            "batch": e["batch"],
            "fraction": e["fraction"],
            "retries": 1,
            "timeout": "15m",
        }
        for key in ("global_batch", "priority"):
            if key in e:
                entry[key] = e[key]
        experiments.append(entry)
    queue = {"gpus": 1, "reserve": "1GiB", "experiments": experiments}
    path = out / "queue.yaml"
    path.write_text(yaml.safe_dump(queue, sort_keys=False))
    return path


def _env(out: Path) -> dict[str, str]:
    return dict(os.environ, JAXFIT_CACHE_DIR=str(out / "cache"), PYTHONUNBUFFERED="1", WANDB_MODE="disabled")


def _jaxfit(out: Path, *args: str, log: str) -> tuple[int, float]:
    started = time.time()
    with open(out / log, "w") as f:
        code = subprocess.call(
            [sys.executable, "-m", "jaxfit.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=_env(out), cwd=REPO
        )
    return code, time.time() - started


def plan_main(out: Path) -> int:
    queue = write_queue(out)
    code, wall = _jaxfit(
        out,
        "schedule",
        str(queue),
        *_logical(),
        "--dry-run",
        "--json",
        str(out / "plan.json"),
        f"--max-batch={MAX_BATCH}",
        "--probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe",
        log="plan.log",
    )
    (out / "plan_meta.json").write_text(json.dumps({"exit_code": code, "wall_seconds": wall}))
    print(f"plan: exit {code} in {wall:.1f} s")
    return code


def packed_main(out: Path) -> int:
    queue = write_queue(out)
    plan = ["--plan", str(out / "plan.json")] if (out / "plan.json").exists() else []
    code, wall = _jaxfit(
        out,
        "schedule",
        str(queue),
        *_logical(),
        *plan,
        "--json",
        str(out / "packed.json"),
        "--state-dir",
        str(out / "state"),
        f"--max-batch={MAX_BATCH}",
        "--monitor-interval=1",
        "--quiet",
        "--probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe",
        log="packed.log",
    )
    (out / "packed_meta.json").write_text(json.dumps({"exit_code": code, "wall_seconds": wall}))
    print(f"packed: exit {code} in {wall:.1f} s")
    return code


def sequential_main(out: Path) -> int:
    """Each run's final command, fraction and GPU, alone, one after another."""
    data = json.loads((out / "packed.json").read_text())
    rows = []
    for e in sorted(data["experiments"], key=lambda e: e["position"]):
        command = list(e["command"])
        for flag, value in (("--batch-size", e["batch_size"]), ("--grad-accum-steps", e["grad_accum_steps"])):
            command = [a for a in command if not a.startswith(flag + "=")] + [f"{flag}={value}"]
        env = dict(
            _env(out),
            XLA_PYTHON_CLIENT_MEM_FRACTION=f"{e['mem_fraction']:g}",
            XLA_PYTHON_CLIENT_PREALLOCATE="true",
            CUDA_VISIBLE_DEVICES="0",
        )
        started = time.time()
        log = out / f"sequential-{e['name']}.log"
        with open(log, "w") as f:
            code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        rows.append(
            {"name": e["name"], "exit_code": code, "seconds": time.time() - started, "command": shlex.join(command)}
        )
        print(f"sequential {e['name']}: exit {code} in {rows[-1]['seconds']:.1f} s", flush=True)
    (out / "sequential.json").write_text(json.dumps(rows, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


def _peak_in_log(path: Path) -> tuple[int | None, int | None]:
    try:
        text = path.read_text()
    except OSError:
        return None, None
    m = re.search(r"memory: peak_bytes_in_use=(\d+) bytes_limit=(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def table_main(out: Path) -> int:
    gib = 1 << 30
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
    packed = json.loads((out / "packed.json").read_text())
    meta = json.loads((out / "packed_meta.json").read_text())
    sequential = {r["name"]: r for r in json.loads((out / "sequential.json").read_text())}
    store = StateStore(out / "state" / "state.sqlite")
    stored_plan = store.meta("plan")
    runs = {r["name"]: r for r in store.meta("runs")}
    outcomes = [a.outcome for a in store.attempts()]
    samples = store.samples()
    store.close()
    gpu_peak = max(gpu_peaks(samples).values(), default=None)
    proc_peaks: dict[str, int] = {}  # each run's highest single-process reading
    for sample in samples:
        if sample.name is not None:
            proc_peaks[sample.name] = max(proc_peaks.get(sample.name, 0), sample.used_bytes)
    first = min(e["started_at"] for e in packed["experiments"])
    last = max(e["ended_at"] for e in packed["experiments"])
    makespan = last - first
    seq_total = sum(r["seconds"] for r in sequential.values())
    lines = [
        "| experiment | batch x accum | fraction | predicted peak | measured peak (JAX) | need (plan) | NVML process peak | packed run s | alone s | attempts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    placements = {p["name"]: p for p in stored_plan["placements"]}
    for e in packed["experiments"]:
        peak, limit = _peak_in_log(Path(e["log_path"]))
        predicted = runs[e["name"]]["peak_bytes"]
        cells = [
            e["name"],
            f"{e['batch_size']} x {e['grad_accum_steps']}",
            f"{e['mem_fraction']:.2f}",
            f"{predicted / gib:.2f} GiB" if predicted else "(given)",
            f"{peak / gib:.2f} GiB of {limit / gib:.2f}" if peak else "n/a",
            f"{placements[e['name']]['need_bytes'] / gib:.2f} GiB",
            f"{proc_peaks[e['name']] / gib:.2f} GiB" if e["name"] in proc_peaks else "n/a",
            f"{e['ended_at'] - e['started_at']:.1f}",
            f"{sequential[e['name']]['seconds']:.1f}",
            str(e["attempts"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    g = stored_plan["gpus"][0]
    lines += [
        "",
        f"- makespan packed: **{makespan:.1f} s** (first start to last end; `jaxfit schedule` wall including "
        f"planning: {meta['wall_seconds']:.1f} s); one at a time: **{seq_total:.1f} s**; ratio "
        f"**{makespan / seq_total:.2f}** (planning included: {meta['wall_seconds'] / seq_total:.2f})",
        f"- GPU 0: plan's most live {g['planned_bytes'] / gib:.2f} GiB of {g['capacity_bytes'] / gib:.2f} GiB capacity "
        f"({g['total_bytes'] / gib:.2f} GiB total); NVML's highest reading of the whole GPU: "
        + (f"{gpu_peak / gib:.2f} GiB" if gpu_peak else "n/a"),
        f"- attempts: {len(outcomes)}, outcomes {sorted(set(o or 'running' for o in outcomes))}; out of memory: "
        f"{sum(1 for o in outcomes if o == 'oom')}",
    ]
    if plan is not None:
        planmeta = json.loads((out / "plan_meta.json").read_text())
        lines.append(f"- planning alone (`--dry-run`, cold cache): {planmeta['wall_seconds']:.1f} s")
    text = "\n".join(lines)
    print(text)
    (out / "table.md").write_text(text + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("plan", "packed", "sequential"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return {"plan": plan_main, "packed": packed_main, "sequential": sequential_main, "table": table_main}[args.what](
        args.out.resolve()
    )


if __name__ == "__main__":
    sys.exit(main())
