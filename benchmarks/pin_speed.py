"""Does the pinned program run as fast as the training process's own compile? (issue 21)

`jaxfit tune --script` of scripts/train.py gpt_small found the grid's winner (remat none, 8 x 8),
but its fresh-process rate ran 4-7 % below the grid's plain run of the same setting, while its
other rows matched theirs within 0.5 % (benchmarks/JOURNAL.md sections 30 and 32). This asks the
program itself, alternating on one GPU: fit the row as the tune proves it (one autotuned compile of
the global batch with --grad-accum-steps, in the script's probe; its pin), then time fresh
processes of the same command in turns, plain (its own compile) and pinned (the proof's program),
each by jaxfit's hook as the grid's points are.

    python benchmarks/pin_speed.py --out DIR [--remat none --accum 8 --pairs 3]

Writes DIR/fit.json, DIR/points.jsonl (each point as it ends) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tune import REPO, script_command, timed_point

from jaxfit.fit.common import extra_environment


def row_arguments(description: str) -> argparse.ArgumentParser:
    """The flags of one row of scripts/train.py (section 32's gpt_small question by default), for
    this benchmark and benchmarks/probe_speed.py."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="gpt_small")
    p.add_argument("--precision", default="bfloat16")
    p.add_argument("--remat", default="none")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--fraction", type=float, default=0.0706)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    return p


def fresh_point(command: list[str], args: argparse.Namespace, pinned_env: dict | None, report: Path) -> dict:
    """:func:`bench_tune.timed_point` of ``command`` at ``args.global_batch``: plain, or with
    ``pinned_env`` (the fit's ``JAXFIT_PIN*``) running the proof's program, its pin report written
    to ``report`` and its ``program_pinned`` (None without a report) in the point. The
    environment is restored after."""
    env = {} if pinned_env is None else dict(pinned_env, JAXFIT_PIN_REPORT=str(report))
    with extra_environment(env):
        point = timed_point(command, args.global_batch, args.fraction, args.warmup, args.steps)
    if pinned_env is not None:  # whether the run really ran the proof's program
        point["program_pinned"] = json.loads(report.read_text()).get("program_pinned") if report.exists() else None
    return point


def main() -> int:
    p = row_arguments(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = tempfile.mkdtemp(prefix="pin-speed-ck-")
    command = script_command(args.config, args.precision, "pinspeed", 40, checkpoints)
    command += [f"--remat={args.remat}", f"--grad-accum-steps={args.accum}"]
    start = time.time()
    fit = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "fit", "--script", "--mem-fraction", str(args.fraction),
         "--min-batch", str(args.global_batch), "--max-batch", str(args.global_batch),
         "--multiple-of", str(args.accum), "--json", str(out / "fit.json"), "--", *command],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    print(f"fit exit {fit.returncode} in {time.time() - start:.1f} s", flush=True)
    if fit.returncode != 0:
        print(fit.stderr[-3000:])
        return 1
    env = json.loads((out / "fit.json").read_text())["env"]
    pinned_env = {k: v for k, v in env.items() if k.startswith("JAXFIT_PIN")}
    batch_cmd = [*command, f"--batch-size={args.global_batch}"]
    rates: dict[str, list[float]] = {"plain": [], "pinned": []}
    for pair in range(args.pairs):
        for kind in ("plain", "pinned") if pair % 2 == 0 else ("pinned", "plain"):
            report = out / f"pin-report-{pair}-{kind}.json"
            point = fresh_point(batch_cmd, args, pinned_env if kind == "pinned" else None, report)
            point.update(kind=kind, pair=pair)
            with (out / "points.jsonl").open("a") as f:
                f.write(json.dumps(point) + "\n")
            if point.get("ok"):
                rates[kind].append(point["samples_per_second"])
            print(json.dumps(point), flush=True)
    for kind, values in rates.items():
        if values:
            print(f"{kind}: median {statistics.median(values):.1f} samples/s of {[round(v, 1) for v in values]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
