#!/usr/bin/env python3
"""Benchmark ``jaxfit tune`` against the exhaustive grid of real runs it replaces, on a GPU.

The grid is what the hand-made profilers did: every setting x every micro-batch that divides the
global batch, each a fresh training process (``python -m jaxfit.tune.trial``: real state, the
step jitted as the example jits it) under the fraction, timed by the same hook
(``JAXFIT_MEASURE``), out-of-memory runs counted with their time. Then ``jaxfit tune`` on the same
question, cold cache. Compared: the best samples/s of each, the wall times, out of memory in
tune's own runs.

Usage (on the GPU machine)::

    python benchmarks/bench_tune.py run --out $OUT/tune --example gpt-small --global-batch 64 \\
        --fraction 0.0706 --remat none,full --precision bfloat16
    python benchmarks/bench_tune.py table benchmarks/results/h100/tune/raw.jsonl

With ``--script-config NAME`` the target is this repository's ``scripts/train.py NAME`` (its own
flags ``--remat``, ``--precision``, ``--batch-size``, ``--grad-accum-steps``): the tune is
``jaxfit tune --script`` over ``--axis=--remat=...`` (by default measured in fresh processes of the script,
its pinned program), and each grid point is a fresh plain run of the script timed by the same hook.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def grid_run(example: str, sets: list[str], batch: int, fraction: float, warmup: int, steps: int) -> dict:
    """One grid point of a built-in example: a fresh ``jaxfit.tune.trial`` process, timed by the hook."""
    cmd = [sys.executable, "-m", "jaxfit.tune.trial", "--example", example, *[f"--set={s}" for s in sets]]
    out = timed_point([*cmd, "--batch", str(batch)], batch, fraction, warmup, steps)
    return dict(out, sets=sets)


def script_command(config: str, precision: str, exp_name: str, train_steps: int, checkpoints: str) -> list[str]:
    """``scripts/train.py CONFIG`` as the tune and the grid run it (no wandb, its own checkpoints)."""
    return [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        config,
        f"--precision={precision}",
        f"--exp-name={exp_name}",
        "--no-wandb-enabled",
        f"--num-train-steps={train_steps}",
        f"--checkpoint-base-dir={checkpoints}",
        "--overwrite",
    ]


def timed_point(cmd: list[str], batch: int, fraction: float, warmup: int, steps: int) -> dict:
    """Run ``cmd`` (a fresh training process, nothing pinned) under ``fraction``, its step timed by
    jaxfit's hook (``JAXFIT_MEASURE``): its samples/s, or how it failed, and its wall time."""
    from jaxfit.fit.budget import fraction_variable
    from jaxfit.fit.command import hooked_pythonpath

    folder = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    report = folder / "measure.json"
    env = dict(
        os.environ,
        PYTHONPATH=hooked_pythonpath(),
        JAXFIT_MEASURE=f"{warmup},{steps}",
        JAXFIT_MEASURE_REPORT=str(report),
        JAXFIT_MEASURE_STEP_NAME="train_step",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env[fraction_variable()] = str(fraction)  # the spelling the installed jaxlib reads, never both
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.time() - start
    out: dict = {"batch": batch, "wall_s": round(wall, 2)}
    if report.exists():
        data = json.loads(report.read_text())
        step = statistics.median(data["step_seconds"])
        out.update(ok=True, step_seconds=step, samples_per_second=batch / step)
    else:
        text = proc.stdout + proc.stderr
        out.update(ok=False, oom="RESOURCE_EXHAUSTED" in text, tail=text.strip().splitlines()[-1:])
    return out


def run_main(args: argparse.Namespace) -> int:
    from jaxfit.tune.space import example_settings

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    record: dict = {
        "example": args.example,
        "global_batch": args.global_batch,
        "fraction": args.fraction,
        "remat": args.remat,
        "precision": args.precision,
        "tune_args": args.tune_arg,
    }
    if args.script_config:
        record.update(example=f"scripts/train.py {args.script_config}", script_config=args.script_config)
    if not args.skip_tune:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as checkpoints:
            if args.script_config:  # the script's own flags: remat an axis, precision fixed
                target = [f"--axis=--remat={args.remat}"]
                script = script_command(args.script_config, args.precision, "tune", args.script_steps, checkpoints)
            else:
                target = ["--example", args.example, "--remat", args.remat, "--precision", args.precision]
                script = []
            cmd = [
                sys.executable,
                "-m",
                "jaxfit.cli",
                "tune",
                *(["--script"] if args.script_config else []),
                *target,
                "--global-batch",
                str(args.global_batch),
                "--mem-fraction",
                str(args.fraction),
                "--warmup",
                str(args.warmup),
                "--steps",
                str(args.steps),
                "--json",
                str(out / "tune.json"),
                "--png",
                str(out / "tune.png"),
                *args.tune_arg,
                *(["--", *script] if script else []),
            ]
            start = time.time()
            # Its progress (every round, compile and timing) and its table go to files as they come:
            # a tune cut by the call's limit still leaves what it did.
            with open(out / "tune.log", "w") as err, open(out / "tune.out", "w") as stdout:
                subprocess.run(
                    cmd, env=dict(os.environ, JAXFIT_CACHE_DIR=cache), stdout=stdout, stderr=err, timeout=3600
                )
            record["tune_wall_s"] = round(time.time() - start, 2)
            log((out / "tune.out").read_text()[-3000:] + (out / "tune.log").read_text()[-2000:])
            if (out / "tune.json").exists():
                record["tune"] = json.loads((out / "tune.json").read_text())
    if not args.skip_grid:
        grid = []
        start = time.time()
        settings = (
            [(f"--remat={r}", r) for r in args.remat.split(",")]
            if args.script_config
            else [(s.name, s) for s in example_settings(args.remat.split(","), args.precision.split(","))]
        )
        for name, setting in settings:
            micros = [m for m in range(args.global_batch, 0, -1) if args.global_batch % m == 0]
            if args.grid_micro:  # a few points of the grid, e.g. to check a tune's winner on its card
                micros = [m for m in micros if m in {int(x) for x in args.grid_micro.split(",")}]
            for micro in micros:
                accum = args.global_batch // micro
                if args.script_config:
                    with tempfile.TemporaryDirectory() as checkpoints:
                        cmd = script_command(args.script_config, args.precision, "grid", args.script_steps, checkpoints)
                        cmd += [name, f"--batch-size={args.global_batch}", f"--grad-accum-steps={accum}"]
                        point = timed_point(cmd, args.global_batch, args.fraction, args.warmup, args.steps)
                else:
                    sets = [f"{k}={v}" for k, v in setting.overrides] + [f"grad_accum_steps={accum}"]
                    point = grid_run(args.example, sets, args.global_batch, args.fraction, args.warmup, args.steps)
                point.update(setting=name, micro_batch=micro, accum_steps=accum)
                grid.append(point)
                with (out / "grid-points.jsonl").open("a") as f:  # each point as it ends: a cut grid keeps them
                    f.write(json.dumps(point) + "\n")
                said = (
                    f"{point['samples_per_second']:.1f} samples/s"
                    if point.get("ok")
                    else "OOM"
                    if point.get("oom")
                    else "failed"
                )
                log(f"  grid {name} {micro} x {accum}: {said} ({point['wall_s']} s)")
        record.update(grid=grid, grid_wall_s=round(time.time() - start, 2))
    with (out / "raw.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    return 0


def table_main(args: argparse.Namespace) -> int:
    for line in Path(args.raw).read_text().splitlines():
        r = json.loads(line)
        grid = r.get("grid", [])
        best_grid = max((g for g in grid if g.get("ok")), key=lambda g: g["samples_per_second"], default=None)
        tune = r.get("tune") or {}
        best = tune.get("best") or {}
        rows = tune.get("rows", [])
        print(
            f"## {r['example']}, global batch {r['global_batch']}, fraction {r['fraction']}, remat {r['remat']}, "
            f"precision {r['precision']}\n"
        )
        print("| | best setting | micro x accum | samples/s | wall s | runs | out of memory |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        if best_grid:
            print(
                f"| grid | {best_grid['setting']} | {best_grid['micro_batch']} x {best_grid['accum_steps']} "
                f"| {best_grid['samples_per_second']:.1f} | {r.get('grid_wall_s')} | {len(grid)} "
                f"| {sum(1 for g in grid if g.get('oom'))} |"
            )
        if best:
            measured = [x for x in rows if x["status"] == "measured"]
            print(
                f"| tune | {best['setting']} | {best['micro_batch']} x {best['accum_steps']} "
                f"| {best['samples_per_second']:.1f} | {r.get('tune_wall_s')} | {len(measured)} "
                f"| {sum(1 for x in rows if x['status'] == 'out of memory')} |"
            )
        if best and best_grid:
            print(
                f"\ntune's winner reaches {best['samples_per_second'] / best_grid['samples_per_second']:.1%} of the "
                f"grid's best; tune took {r['tune_wall_s'] / r['grid_wall_s']:.2f} of the grid's wall time"
                + (f"; the winner's MFU {best['mfu']:.1%}" if best.get("mfu") is not None else "")
            )
        print()
        for g in grid:
            print(
                f"- grid {g['setting']} {g['micro_batch']} x {g['accum_steps']}: "
                + (
                    f"{g['samples_per_second']:.1f} samples/s"
                    if g.get("ok")
                    else "out of memory"
                    if g.get("oom")
                    else "failed"
                )
                + f" ({g['wall_s']} s)"
            )
    return 0


def grid_main(args: argparse.Namespace) -> int:
    """The grid's points from the halves' folders (each point as it ended), the wall time of each
    half and their sum (what the grid takes on one card), and the best point."""
    points, walls = [], {}
    for half in args.halves:
        f = Path(half) / "grid-points.jsonl"
        got = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
        points += got
        walls[Path(half).name] = round(sum(p["wall_s"] for p in got), 1)
    best = max((p for p in points if p.get("ok")), key=lambda p: p["samples_per_second"], default=None)
    print("grid points", len(points), "walls", walls, "sum", round(sum(walls.values()), 1))
    if best:
        print(
            "grid best",
            best["setting"],
            best["micro_batch"],
            "x",
            best["accum_steps"],
            round(best["samples_per_second"], 1),
        )
    for p in points:
        said = f"{p['samples_per_second']:.1f}" if p.get("ok") else ("OOM" if p.get("oom") else "failed")
        print(f"  {p['setting']} {p['micro_batch']} x {p['accum_steps']}: {said} ({p['wall_s']} s)")
    return 0


def tune_main(args: argparse.Namespace) -> int:
    """A tune side's summary from its --out folder: its wall time, phases and best, then each row
    (status, rate, untuned rate, what proving it cost)."""
    raw = Path(args.side) / "raw.jsonl"
    if not raw.exists():
        print(args.name or Path(args.side).name, "no raw.jsonl")
        return 1
    r = json.loads(raw.read_text().splitlines()[-1])
    t = r.get("tune") or {}
    b = t.get("best") or {}
    print(
        args.name or Path(args.side).name,
        "wall",
        r.get("tune_wall_s"),
        "phases",
        t.get("phase_seconds"),
        "best",
        b.get("setting"),
        b.get("micro_batch"),
        "x",
        b.get("accum_steps"),
        round(b.get("samples_per_second") or 0, 1),
    )
    for x in t.get("rows", []):
        print(
            "  ",
            x["setting"],
            x["micro_batch"],
            "x",
            x["accum_steps"],
            x["status"],
            round(x.get("samples_per_second") or 0, 1),
            "untuned",
            x.get("untuned_samples_per_second"),
            "prove_s",
            x.get("prove_seconds"),
            "compile_s",
            x.get("compile_seconds"),
            "timing_s",
            x.get("timing_seconds"),
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--example", default="gpt-small")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--fraction", type=float, required=True)
    p.add_argument("--remat", default="none,full")
    p.add_argument("--precision", default="bfloat16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-tune", action="store_true")
    p.add_argument("--skip-grid", action="store_true")
    p.add_argument(
        "--script-config",
        default="",
        help="tune and grid scripts/train.py with this config (e.g. gpt_small) instead of --example",
    )
    p.add_argument("--script-steps", type=int, default=20, help="--num-train-steps of the script's runs")
    p.add_argument("--grid-micro", default="", help="only these micro-batches in the grid (comma-separated)")
    p.add_argument(
        "--tune-arg", action="append", default=[], help="passed to jaxfit tune, e.g. --tune-arg=--measure=inline"
    )
    p = sub.add_parser("table")
    p.add_argument("raw")
    p = sub.add_parser("grid", help="sum up the grid's halves (the --out folders of the grid's runs)")
    p.add_argument("halves", nargs="+")
    p = sub.add_parser("tune", help="sum up a tune side (the --out folder of a tune run)")
    p.add_argument("side")
    p.add_argument("name", nargs="?", default="")
    args = parser.parse_args()
    return {"run": run_main, "table": table_main, "grid": grid_main, "tune": tune_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
