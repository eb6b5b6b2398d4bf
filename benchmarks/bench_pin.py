#!/usr/bin/env python3
"""Benchmark pinning on a real GPU: does the training process run the program jaxfit proved?

For each workload, at a fraction where jaxfit's answer sits at its boundary (the budgets of
``benchmarks/bench_fit.py`` on an H100, where the answer's neighbour runs out of memory):

1. ``jaxfit fit`` (cold cache) gives the answer B, its proven peak, and the pin;
2. ``--trials`` fresh processes train B for 3 steps **with** the pin: jaxfit's start-up hook on
   PYTHONPATH and ``JAXFIT_PIN`` (the environment ``jaxfit fit`` prints), calling the jitted step
   as a training script does;
3. ``--trials`` fresh processes train B **without** it: the step compiled in the process, as
   without jaxfit (its compiled peak is read from its own memory analysis).

Each trial records whether it ran out of memory, the allocator's ``peak_bytes_in_use``, the peak of
the program it ran, whether that was the pinned one, and its time from process start to the end
of its first step. ``scripts/train.py gpt_small`` is measured the same way through ``jaxfit run``
(pinned) and by hand with the fitted batch (not pinned).

Usage (on the GPU machine)::

    python benchmarks/bench_pin.py run --out $OUT/pin [--only gpt-small-fp32 ...] [--trials 3]
    python benchmarks/bench_pin.py table benchmarks/results/h100/pin/raw.jsonl
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

# name -> (example, overrides, fraction on an H100 80GB)
WORKLOADS: dict[str, tuple[str, dict[str, str], float]] = {
    "gpt-small-fp32": ("gpt-small", {}, 0.212),
    "gpt-small-bf16-remat": ("gpt-small", {"dtype": "bfloat16", "remat": "true"}, 0.0706),
    "gpt-medium-bf16-remat": ("gpt-medium-bf16-remat", {}, 0.08),
    "vit-small-fp32": ("vit-small", {}, 0.0177),
    "mlp-fp32": ("mlp", {}, 0.014),
    "train.py-gpt_small": ("gpt_small", {}, 0.212),  # scripts/train.py: jaxfit run, and by hand
    "gpt-tiny-fp32": ("gpt-tiny", {}, 0.012),  # smoke tests of this script on a CPU
    "train.py-debug": ("debug", {}, 0.0005),
}
SCRIPTS = ("train.py-gpt_small", "train.py-debug")
MARK = "JAXFIT_BENCH "


def trial_main(args: argparse.Namespace) -> int:
    """One training process: real state, ``--steps`` real steps at ``--batch``.

    ``--pinned``: the jitted step is called, as in a training script, so jaxfit's start-up hook
    (when on PYTHONPATH with ``JAXFIT_PIN``) loads the pinned program. Otherwise the step is
    lowered and compiled here (what ``jax.jit`` does on its first call) and its analysis recorded.
    """
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

    cfg = load_config(args.example, dict(kv.split("=", 1) for kv in args.set))
    record: dict = {"batch": args.batch, "ok": False, "pinned_call": args.pinned}
    try:
        tx = make_optimizer(cfg)
        graphdef, _ = abstract_state(cfg, tx)
        step = jax.jit(make_train_step(cfg, graphdef, tx), donate_argnums=0)
        state = jax.jit(lambda key: init_state(cfg, key, tx)[1])(jax.random.key(0))
        batch = synthetic_batch(cfg, args.batch, jax.random.key(1))
        if args.pinned:
            run = step
        else:
            compiled = step.lower(state, batch).compile()
            record["program_peak_bytes"] = analyse(compiled).peak_bytes
            run = compiled
        for i in range(args.steps):
            state, metrics = run(state, batch)
            if i == 0:
                jax.block_until_ready(metrics["loss"])
                record["first_step_at"] = time.time()
        loss = float(jax.block_until_ready(metrics["loss"]))
        stats = jax.devices()[0].memory_stats() or {}
        record.update(
            ok=True, loss=loss, peak_bytes_in_use=stats.get("peak_bytes_in_use"), bytes_limit=stats.get("bytes_limit")
        )
    except Exception as e:  # the trial's answer, not a crash of the benchmark
        message = f"{type(e).__name__}: {e}"
        record.update(ok=False, oom=is_out_of_memory(message), error=message.splitlines()[0][:300])
    print(MARK + json.dumps(record), flush=True)
    return 0


def _env(fit: dict | None, report: Path | None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_PIN") and k != "XLA_PYTHON_CLIENT_PREALLOCATE"
    }
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if fit is not None:
        env.update(fit["env"])
        env["PYTHONPATH"] = fit["env"].get("PYTHONPATH", "") + os.pathsep + os.environ.get("PYTHONPATH", "")
    if report is not None:
        env["JAXFIT_PIN_REPORT"] = str(report)
    return env


def run_trial(
    example: str, overrides: dict[str, str], fraction: float, batch: int, fit: dict | None, folder: Path
) -> dict:
    """A fresh training process at ``batch``; pinned when ``fit`` (its env) is given."""
    report = folder / f"report-{time.time_ns()}.json"
    env = _env(fit, report if fit else None)
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(fraction)
    cmd = [sys.executable, __file__, "trial", "--example", example, "--batch", str(batch)]
    cmd += ["--pinned"] if fit else []
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    record: dict = {
        "batch": batch,
        "ok": False,
        "crash": True,
        "error": " | ".join(proc.stderr.strip().splitlines()[-3:])[:300],
    }
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            record = json.loads(line[len(MARK) :])
    record["process_wall_s"] = round(time.time() - start, 3)
    if "first_step_at" in record:
        record["time_to_first_step_s"] = round(record.pop("first_step_at") - start, 3)
    if report.exists():
        hook = json.loads(report.read_text())
        record.update(
            program_pinned=hook["program_pinned"],
            program_peak_bytes=hook["program_peak_bytes"],
            pin_reason=hook["reason"],
        )
    elif fit:
        record.update(program_pinned=False, pin_reason="no report (the hook did not run)")
    else:
        record["program_pinned"] = False
    return record


def script_trial(
    config: str, fraction: float, batch: int, fit: dict | None, folder: Path, *, through_run: bool
) -> dict:
    """``scripts/train.py CONFIG`` for 3 steps at ``batch``.

    ``through_run``: the whole user flow, ``jaxfit run`` (it fits again, then runs pinned); else by
    hand with the environment ``jaxfit fit`` printed (``fit``'s ``env``: pinned), or with the
    fraction alone (``fit`` None: not pinned). The hook's report says which program ran.
    """
    train = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        config,
        f"--exp-name=bench-{time.time_ns()}",
        f"--checkpoint-base-dir={folder / 'ck'}",
        "--num-train-steps=3",
        "--log-interval=1",
        "--save-interval=1000000",
        "--no-wandb-enabled",
    ]
    report = folder / f"report-{time.time_ns()}.json"
    start = time.time()
    if through_run:
        cmd = [
            sys.executable,
            "-m",
            "jaxfit.cli",
            "run",
            "--mem-fraction",
            str(fraction),
            "--json",
            str(folder / "run.json"),
            "--quiet",
            f"--probe-arg=--checkpoint-base-dir={folder / 'probe'}",
            "--",
            *train,
        ]
        env = _env(None, None)
    else:
        cmd = [*train, f"--batch-size={batch}"]
        env = _env(fit, report if fit else None)
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(fraction)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    out = proc.stdout + proc.stderr
    record: dict = {
        "batch": batch,
        "ok": proc.returncode == 0,
        "oom": "RESOURCE_EXHAUSTED" in out,
        "process_wall_s": round(time.time() - start, 3),
        "through_run": through_run,
    }
    if proc.returncode != 0:
        record["error"] = " | ".join(out.strip().splitlines()[-3:])[:300]
    for line in out.splitlines():
        if line.startswith("memory: peak_bytes_in_use="):
            record["peak_bytes_in_use"] = int(line.split("=")[1].split()[0])
    if through_run and (folder / "run.json").exists():
        run = json.loads((folder / "run.json").read_text())
        record.update(
            program_pinned=run.get("program_pinned"),
            batch=run.get("batch_size"),
            program_peak_bytes=run.get("run", {}).get("program_peak_bytes"),
        )
    elif report.exists():
        hook = json.loads(report.read_text())
        record.update(program_pinned=hook["program_pinned"], program_peak_bytes=hook["program_peak_bytes"])
    else:
        record["program_pinned"] = False
    return record


def run_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw.jsonl"

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        device = (
            subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError):
        device = "cpu"
    cache = tempfile.mkdtemp(prefix="jaxfit-bench-pin-")
    os.environ["JAXFIT_CACHE_DIR"] = cache
    for name in args.only or list(WORKLOADS):
        example, overrides, fraction = WORKLOADS[name]
        fraction = args.fraction or fraction
        log(f"== {name} at fraction {fraction} on {device}")
        folder = Path(tempfile.mkdtemp(prefix=f"bench-pin-{name}-"))
        if name in SCRIPTS:
            cmd = [
                sys.executable,
                "-m",
                "jaxfit.cli",
                "fit",
                "--script",
                "--mem-fraction",
                str(fraction),
                "--json",
                str(out / f"{name}.fit.json"),
                "--quiet",
                "--",
                sys.executable,
                str(REPO / "scripts" / "train.py"),
                example,
                "--exp-name=bench-fit",
                "--no-wandb-enabled",
                f"--checkpoint-base-dir={folder / 'probe'}",
            ]
        else:
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
                str(out / f"{name}.fit.json"),
                "--quiet",
            ]
            for k, v in overrides.items():
                cmd += ["--set", f"{k}={v}"]
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        fit_s = time.time() - start
        if proc.returncode != 0:
            log(f"  fit failed: {proc.stderr.strip()[-400:]}")
            continue
        fit = json.loads((out / f"{name}.fit.json").read_text())
        log(
            f"  fit: batch {fit['batch_size']}, peak {fit['peak_bytes']:,} of budget {fit['budget_bytes']:,} "
            f"({fit_s:.0f} s), pinned={bool(fit['pin'])}"
        )
        trials = []
        if name in SCRIPTS:  # the whole flow once: jaxfit run fits again and runs pinned
            t = script_trial(example, fraction, fit["batch_size"], None, folder, through_run=True)
            t.update(with_pin=True, index=-1)
            trials.append(t)
            log(
                f"  jaxfit run: {'ok' if t['ok'] else 'FAILED'} batch {t.get('batch')} pinned={t.get('program_pinned')}"
                f" measured {t.get('peak_bytes_in_use')}"
            )
        for pinned in (True, False):
            for i in range(args.trials):
                if name in SCRIPTS:
                    t = script_trial(
                        example, fraction, fit["batch_size"], fit if pinned else None, folder, through_run=False
                    )
                else:
                    t = run_trial(example, overrides, fraction, fit["batch_size"], fit if pinned else None, folder)
                t.update(with_pin=pinned, index=i)
                trials.append(t)
                log(
                    f"  {'pinned' if pinned else 'plain '} {i}: {'ok' if t['ok'] else 'OOM' if t.get('oom') else 'FAILED'}"
                    f" program {t.get('program_peak_bytes')} measured {t.get('peak_bytes_in_use')} "
                    f"pinned={t.get('program_pinned')} first step {t.get('time_to_first_step_s')} s"
                )
        record = {
            "workload": name,
            "example": example,
            "overrides": overrides,
            "mem_fraction": fraction,
            "device": device,
            "batch_size": fit["batch_size"],
            "proven_peak_bytes": fit["peak_bytes"],
            "budget_bytes": fit["budget_bytes"],
            "limit_bytes": fit["limit_bytes"],
            "pinned_peak_bytes": (fit["pin"] or {}).get("peak_bytes"),
            "fit_wall_s": round(fit_s, 1),
            "trials": trials,
        }
        with raw.open("a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


def table_main(args: argparse.Namespace) -> int:
    records = [json.loads(line) for raw in args.raw for line in Path(raw).read_text().splitlines() if line.strip()]
    print(
        "| workload | fraction | limit | batch | proven peak | with pin: OOM, runs pinned | with pin: program "
        "| with pin: measured peak | plain: OOM | plain: program peaks (vs proven) | plain: measured peak "
        "| first step with pin / plain (s) |"
    )
    print("|" + " --- |" * 12)

    def spread(values: list, base: int) -> str:
        got = sorted({v for v in values if v})
        if not got:
            return "-"
        return ", ".join(f"{v:,}" + (f" ({v - base:+,})" if v != base else " (=)") for v in got)

    for r in records:
        proven = r["proven_peak_bytes"]
        pinned = [t for t in r["trials"] if t["with_pin"]]
        plain = [t for t in r["trials"] if not t["with_pin"]]

        def first(ts: list) -> str:
            got = [t["time_to_first_step_s"] for t in ts if t.get("time_to_first_step_s")]
            return f"{statistics.median(got):.1f}" if got else "-"

        print(
            f"| {r['workload']} | {r['mem_fraction']} | {r['limit_bytes']:,} | {r['batch_size']} | {proven:,} "
            f"| {sum(1 for t in pinned if not t['ok'])} OOM, {sum(1 for t in pinned if t.get('program_pinned'))}"
            f"/{len(pinned)} pinned | {spread([t.get('program_peak_bytes') for t in pinned], proven)} "
            f"| {spread([t.get('peak_bytes_in_use') for t in pinned], proven)} "
            f"| {sum(1 for t in plain if not t['ok'])} / {len(plain)} "
            f"| {spread([t.get('program_peak_bytes') for t in plain], proven)} "
            f"| {spread([t.get('peak_bytes_in_use') for t in plain], proven)} "
            f"| {first(pinned)} / {first(plain)} |"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run the benchmark (GPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="*", choices=list(WORKLOADS))
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--fraction", type=float)
    p = sub.add_parser("table", help="render raw.jsonl as a markdown table")
    p.add_argument("raw", nargs="+")
    p = sub.add_parser("trial", help="internal: one training process")
    p.add_argument("--example", required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pinned", action="store_true")
    args = parser.parse_args()
    return {"run": run_main, "table": table_main, "trial": trial_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
