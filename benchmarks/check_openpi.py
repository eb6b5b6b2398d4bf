#!/usr/bin/env python3
"""Check jaxfit against a real openpi checkout, as its users run it: fit, inverse, run, schedule.

openpi is not part of this project: bring its checkout and its own environment (its pinned jax,
flax, jaxtyping, torch...; on a CPU machine see docs/guides/openpi.md), then::

    python benchmarks/check_openpi.py --openpi ~/openpi --python ~/openpi/.venv/bin/python --out check/

Each check runs the ``jaxfit`` of this environment on openpi's ``scripts/train.py debug`` config,
with the documented commands only (no workaround flags: data-loader workers on, openpi's run-time
type checks on, its persistent compilation cache on, no wandb credentials):

1. ``fit``: the largest batch under fraction 0.5 of a 24 GiB device, with a pinned program, and
   nothing left where the real run looks (the probe's checkpoint folder);
2. ``inverse``: the smallest fraction for that batch, at most 0.5;
3. ``fit-again``: the same answer a second time (the script's own compilation cache is warm now;
   peaks must not depend on it);
4. ``run``: ``jaxfit run`` trains 2 steps with the fitted settings, the training process loads the
   pinned program, and wandb (offline, no credentials) gets jaxfit's settings;
5. ``schedule``: a two-run queue on a logical 24 GiB GPU (one fitted, one given) runs to the end.

It prints a pass/fail table and writes ``results.json`` and each command's log under ``--out``.
Exit code 0 when every check passed. On a 2-core CPU machine the whole check takes 20-30 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXP = "jaxfit-check"
SIZE = ["--device-memory", "24GiB"]


def jaxfit(
    *args: str, cwd: Path, env: dict[str, str], log: Path, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Run this environment's jaxfit; its output goes to ``log`` too."""
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    log.write_text(
        f"$ jaxfit {' '.join(args)}\n# exit {proc.returncode} after {time.time() - start:.0f} s\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}\n"
    )
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openpi", required=True, type=Path, help="the openpi checkout")
    parser.add_argument("--python", required=True, help="openpi's own Python (its virtual environment)")
    parser.add_argument("--out", type=Path, default=Path("openpi-check"), help="where logs and results.json go")
    parser.add_argument(
        "--home", type=Path, default=None, help="HOME for openpi (its ~/.cache/jax); default: a folder in --out"
    )
    args = parser.parse_args()

    openpi = args.openpi.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    home = (args.home or out / "home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "JAXFIT_PIN", "XLA_PYTHON"))}
    env.update(HOME=str(home), JAXFIT_CACHE_DIR=str(out / "jaxfit-cache"), WANDB_DIR=str(out / "wandb"))
    (out / "wandb").mkdir(exist_ok=True)
    train = [args.python, "scripts/train.py", "debug"]
    checkpoints = openpi / "checkpoints" / "debug"
    # A check cut short earlier may have left its folders: the fit check asks whether the probe
    # leaves one, so none may be there before it starts.
    for stale in checkpoints.glob(f"{EXP}*"):
        shutil.rmtree(stale, ignore_errors=True)
    rows: list[dict[str, Any]] = []

    def record(name: str, ok: bool, detail: str, seconds: float) -> None:
        rows.append({"check": name, "passed": ok, "detail": detail, "seconds": round(seconds, 1)})
        print(f"{'PASS' if ok else 'FAIL'}  {name:<10} {seconds:6.0f} s  {detail}", flush=True)

    # 1. fit
    start = time.time()
    proc = jaxfit(
        "fit",
        "--script",
        *SIZE,
        "--mem-fraction",
        "0.5",
        "--json",
        str(out / "fit.json"),
        "--",
        *train,
        f"--exp-name={EXP}",
        cwd=openpi,
        env=env,
        log=out / "fit.log",
    )
    fit = json.loads((out / "fit.json").read_text()) if proc.returncode == 0 else {}
    left = (checkpoints / EXP).exists()
    record(
        "fit",
        proc.returncode == 0 and bool(fit.get("pin")) and not left,
        (
            f"batch {fit['batch_size']}, peak {fit['peak_bytes'] / 2**30:.2f} GiB of {fit['budget_bytes'] / 2**30:.2f} "
            f"GiB, pinned={bool(fit.get('pin'))}, probe's checkpoint folder left={left}"
        )
        if fit
        else proc.stderr.strip().splitlines()[-1][:300]
        if proc.stderr.strip()
        else f"exit {proc.returncode}",
        time.time() - start,
    )
    batch = int(fit.get("batch_size") or 4)

    # 2. inverse
    start = time.time()
    proc = jaxfit(
        "fit",
        "--script",
        *SIZE,
        "--batch-size",
        str(batch),
        "--json",
        str(out / "inverse.json"),
        "--",
        *train,
        f"--exp-name={EXP}",
        cwd=openpi,
        env=env,
        log=out / "inverse.log",
    )
    inverse = json.loads((out / "inverse.json").read_text()) if proc.returncode == 0 else {}
    record(
        "inverse",
        bool(inverse) and inverse["mem_fraction"] <= 0.5,
        f"batch {batch} needs fraction {inverse['mem_fraction']:.2f}" if inverse else f"exit {proc.returncode}",
        time.time() - start,
    )

    # 3. the same fit again, with openpi's compilation cache warm
    start = time.time()
    proc = jaxfit(
        "fit",
        "--script",
        *SIZE,
        "--mem-fraction",
        "0.5",
        "--json",
        str(out / "fit-again.json"),
        "--",
        *train,
        f"--exp-name={EXP}",
        cwd=openpi,
        env=env,
        log=out / "fit-again.log",
    )
    again = json.loads((out / "fit-again.json").read_text()) if proc.returncode == 0 else {}
    same = (
        bool(again)
        and bool(fit)
        and again["batch_size"] == fit["batch_size"]
        and again["peak_bytes"] == fit["peak_bytes"]
    )
    record(
        "fit-again",
        same,
        f"batch {again.get('batch_size')}, peak {again.get('peak_bytes')} B (first: {fit.get('peak_bytes')} B)",
        time.time() - start,
    )

    # 4. run
    start = time.time()
    proc = jaxfit(
        "run",
        *SIZE,
        "--mem-fraction",
        "0.5",
        "--json",
        str(out / "run.json"),
        "--",
        *train,
        f"--exp-name={EXP}-run",
        "--overwrite",
        "--num-train-steps=2",
        "--wandb-enabled",
        cwd=openpi,
        env=env,
        log=out / "run.log",
    )
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    offline = list((out / "wandb").glob("wandb/offline-run-*")) + list((out / "wandb").glob("offline-run-*"))
    record(
        "run",
        proc.returncode == 0 and bool(run.get("program_pinned")) and bool(offline),
        f"exit {proc.returncode}, batch {run.get('batch_size')}, program_pinned={run.get('program_pinned')}, "
        f"offline wandb runs: {len(offline)}",
        time.time() - start,
    )
    shutil.rmtree(checkpoints / f"{EXP}-run", ignore_errors=True)

    # 5. schedule: one fitted run and one given, one after the other on a 24 GiB logical GPU
    start = time.time()
    queue = out / "queue.yaml"
    queue.write_text(
        "gpus: 1\ndevice_memory: 24GiB\nreserve: 0\nprocess_overhead: 0\nexperiments:\n"
        f"  - name: fitted\n    command: {json.dumps([*train, f'--exp-name={EXP}-a', '--overwrite', '--num-train-steps=2'])}\n"
        "    batch: auto\n    fraction: 0.6\n"
        f"  - name: given\n    command: {json.dumps([*train, f'--exp-name={EXP}-b', '--overwrite', '--num-train-steps=2'])}\n"
        "    batch: 2\n    fraction: 0.5\n"
    )
    proc = jaxfit(
        "schedule",
        str(queue),
        "--state-dir",
        str(out / "schedule"),
        "--json",
        str(out / "schedule.json"),
        "--quiet",
        cwd=openpi,
        env=env,
        log=out / "schedule.log",
    )
    sched = json.loads((out / "schedule.json").read_text()) if (out / "schedule.json").exists() else {}
    states = {e["name"]: e["state"] for e in sched.get("experiments", [])}
    pinned = {e["name"]: e.get("program_pinned") for e in sched.get("experiments", [])}
    record(
        "schedule",
        proc.returncode == 0 and set(states.values()) == {"done"} and pinned.get("fitted") is True,
        f"states {states}, program_pinned {pinned}",
        time.time() - start,
    )
    for name in ("a", "b"):
        shutil.rmtree(checkpoints / f"{EXP}-{name}", ignore_errors=True)

    commit = subprocess.run(["git", "-C", str(openpi), "log", "--oneline", "-1"], capture_output=True, text=True).stdout
    jax_version = subprocess.run(
        [args.python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    summary = {
        "openpi": commit.strip(),
        "openpi_jax": jax_version,
        "checks": rows,
        "passed": all(r["passed"] for r in rows),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"openpi {commit.strip()} (jax {jax_version}): {sum(r['passed'] for r in rows)}/{len(rows)} checks passed")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
