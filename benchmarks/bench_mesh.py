#!/usr/bin/env python3
"""Benchmark fits of sharded steps on a machine with several GPUs.

``answers``: for each FSDP size, ``jaxfit run`` fits ``scripts/train.py CONFIG --fsdp-devices F``
on every visible GPU (the probe compiles the script's own sharded step), then trains 3 steps at
the answer with the pinned program; then a fresh process without jaxfit trains at the answer plus
one step of the device count (the next batch that splits over the devices). Targets: the answer
runs (0 out of memory), the next one does not.

``whatif``: ``jaxfit plan`` of the same model as a built-in example, for a card equal to this GPU
and the given meshes, twice: on the real GPUs, and with one GPU visible (a mocked topology of as
many GPUs as the mesh needs). Every cell is compared.

Usage (on the GPU machine)::

    python benchmarks/bench_mesh.py answers --out $OUT/mesh --config gpt_medium_bf16_remat --fraction 0.25
    python benchmarks/bench_mesh.py whatif --out $OUT/mesh --example gpt-medium-bf16-remat --fraction 0.25
    python benchmarks/bench_mesh.py table benchmarks/results/h100x2/mesh [more folders]

Every record goes to ``raw.jsonl`` in ``--out`` as soon as it is made.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OOM = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def _log(out: Path, record: dict) -> None:
    record["at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (out / "raw.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("_tail")}), flush=True)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (by parent links, so children in their own sessions too)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _run_logged(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> int | None:
    """Run ``cmd`` with its output streamed to ``log``; None when it ran past ``timeout``.

    Past the limit every process below it gets SIGABRT first, so the Python ones print where
    each thread was (faulthandler, on through PYTHONFAULTHANDLER) into the log through their
    parent, then the whole tree is killed: nothing is left holding a GPU for the next run.
    """
    env = dict(env or os.environ, PYTHONFAULTHANDLER="1")
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        below = _descendants(proc.pid)
        _signal(below, signal.SIGABRT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        _signal([proc.pid, *below, *_descendants(proc.pid)], signal.SIGKILL)
        proc.wait()
        f.write(f"\n[bench_mesh: cut at the {timeout:.0f} s limit; stacks above]\n")
        return None


def _gpu_count() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except OSError:
        return 0


def _train_args(config: str, fsdp: int, folder: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        config,
        f"--exp-name=bench-fsdp{fsdp}",
        "--overwrite",
        f"--fsdp-devices={fsdp}",
        "--num-train-steps=3",
        "--log-interval=1",
        "--save-interval=1000",
        "--no-wandb-enabled",
        f"--checkpoint-base-dir={folder}",
    ]


def answers_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    devices = _gpu_count() or int(args.devices)
    for fsdp in args.fsdp:
        with tempfile.TemporaryDirectory() as folder:
            result_file = out / f"run-{devices}x-fsdp{fsdp}.json"
            cmd = [sys.executable, "-m", "jaxfit.cli", "run", "--mem-fraction", str(args.fraction)]
            cmd += ["--min-batch", str(args.min_batch), "--max-batch", str(args.max_batch)]
            cmd += ["--json", str(result_file), "--", *_train_args(args.config, fsdp, folder)]
            start = time.time()
            # Streamed to a file as it goes: a run cut by the time limit keeps what it said.
            log = out / f"run-{devices}x-fsdp{fsdp}.log"
            rc = _run_logged(cmd, log, args.timeout)
            text = log.read_text(errors="replace")
            record: dict = {
                "kind": "answer",
                "config": args.config,
                "fsdp": fsdp,
                "devices": devices,
                "fraction": args.fraction,
                "rc": rc,
                "wall_s": round(time.time() - start, 1),
                "oom": any(m in text for m in OOM),
                "log_tail": text[-1500:],
            }
            if result_file.exists():
                data = json.loads(result_file.read_text())
                fit = data.get("fit") or {}
                record.update(
                    batch=fit.get("batch_size"),
                    peak_bytes=fit.get("peak_bytes"),
                    budget_bytes=fit.get("budget_bytes"),
                    mesh=fit.get("mesh"),
                    device_count=fit.get("device_count"),
                    outcome=fit.get("outcome"),
                    program_pinned=data.get("program_pinned"),
                    pinned_peak_bytes=data.get("pinned_peak_bytes"),
                    fit_wall_s=fit.get("wall_seconds"),
                )
            for line in text.splitlines():
                if line.startswith("memory: peak_bytes_in_use="):
                    record["peak_bytes_in_use_gpu0"] = int(line.split("=")[1].split()[0])
            _log(out, record)
            batch = record.get("batch")
            if not batch:
                continue
            step = int(record.get("device_count") or devices)
            bigger = batch + step
            env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=str(args.fraction), TF_CPP_MIN_LOG_LEVEL="2")
            start = time.time()
            trial_log = out / f"next-up-{devices}x-fsdp{fsdp}.log"
            trial_rc = _run_logged(
                [*_train_args(args.config, fsdp, folder), f"--batch-size={bigger}"], trial_log, args.next_timeout, env
            )
            trial_text = trial_log.read_text(errors="replace")
            _log(
                out,
                {
                    "kind": "next-up",
                    "config": args.config,
                    "fsdp": fsdp,
                    "devices": devices,
                    "fraction": args.fraction,
                    "batch": bigger,
                    "rc": trial_rc,
                    "wall_s": round(time.time() - start, 1),
                    "oom": any(m in trial_text for m in OOM),
                    "log_tail": trial_text[-1500:],
                },
            )
    return 0


def _plan(args: argparse.Namespace, out: Path, label: str, fsdp: int, env: dict[str, str]) -> None:
    """One cell: ``jaxfit plan`` of one mesh, its progress streamed to a log in ``out``."""
    result_file = out / f"plan-{label}-{args.devices}x-fsdp{fsdp}.json"
    cmd = [sys.executable, "-m", "jaxfit.cli", "plan", "--example", args.example, "--mem-fraction", str(args.fraction)]
    cmd += ["--no-default-cards", "--card", f"{args.card_name}={args.card}", "--devices", str(args.devices)]
    cmd += ["--fsdp", str(fsdp), "--json", str(result_file), "--no-cache"]
    cmd += ["--min-batch", str(args.min_batch), "--max-batch", str(args.max_batch)]
    cmd += [] if args.verify else ["--no-verify"]
    start = time.time()
    rc = _run_logged(cmd, out / f"plan-{label}-{args.devices}x-fsdp{fsdp}.log", args.timeout, env)
    record: dict = {
        "kind": "plan",
        "label": label,
        "devices": args.devices,
        "fsdp": fsdp,
        "rc": rc,
        "wall_s": round(time.time() - start, 1),
    }
    if result_file.exists():
        record["cells"] = [
            {
                k: c[k]
                for k in ("card", "devices", "fsdp", "status", "batch_size", "peak_bytes", "budget_bytes", "seconds")
            }
            for c in json.loads(result_file.read_text())["cells"]
        ]
    _log(out, record)


def whatif_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for fsdp in args.fsdp:
        for label in args.only or ["real", "mock"]:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            if label == "mock":  # one GPU visible: the first of those this process may use
                env["CUDA_VISIBLE_DEVICES"] = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
            _plan(args, out, label, fsdp, env)
    return 0


def table_main(args: argparse.Namespace) -> int:
    records = [
        json.loads(line)
        for folder in args.folders
        if (Path(folder) / "raw.jsonl").exists()
        for line in (Path(folder) / "raw.jsonl").read_text().splitlines()
        if line
    ]
    print("| fsdp | devices | answer (global) | peak per device | budget | pinned | ran 3 steps | next up | next up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        if r["kind"] != "answer":
            continue
        nxt = next(
            (n for n in records if n["kind"] == "next-up" and (n["fsdp"], n["devices"]) == (r["fsdp"], r["devices"])),
            None,
        )
        ran = "yes" if r["rc"] == 0 else ("timed out" if r["rc"] is None else f"no (rc {r['rc']})")
        up = "-" if nxt is None else ("out of memory" if nxt["oom"] else f"ran (rc {nxt['rc']})")
        print(
            f"| {r['fsdp']} | {r['devices']} | {r.get('batch')} | {r.get('peak_bytes') or 0:,} "
            f"| {r.get('budget_bytes') or 0:,} | {r.get('program_pinned')} | {ran} "
            f"| {nxt['batch'] if nxt else '-'} | {up} |"
        )
    cells = [(r["label"], c) for r in records if r["kind"] == "plan" for c in r.get("cells", [])]
    timeouts = [r for r in records if r["kind"] == "plan" and r["rc"] is None]
    if cells or timeouts:
        print()
        print("| card | devices | fsdp | compiled | status | batch | peak per device | budget | s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for label, c in cells:
            peak = f"{c['peak_bytes']:,}" if c["peak_bytes"] else "-"
            budget = f"{c['budget_bytes']:,}" if c["budget_bytes"] else "-"
            print(
                f"| {c['card']} | {c['devices']} | {c['fsdp']} | {label} | {c['status']} | {c['batch_size']} "
                f"| {peak} | {budget} | {c['seconds']} |"
            )
        for r in timeouts:
            print(
                f"| | {r.get('devices', '')} | {r['fsdp']} | {r['label']} | timed out after {r['wall_s']} s | | | | |"
            )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("answers")
    a.add_argument("--out", required=True)
    a.add_argument("--config", default="gpt_medium_bf16_remat")
    a.add_argument("--fraction", type=float, default=0.25)
    a.add_argument("--fsdp", type=int, nargs="+", default=[1, 2])
    a.add_argument("--devices", type=int, default=2, help="device count when there is no nvidia-smi (CPU smoke)")
    a.add_argument("--timeout", type=float, default=560)
    a.add_argument("--next-timeout", type=float, default=240, help="limit of the plain run at the answer + one step")
    a.add_argument("--min-batch", type=int, default=1)
    a.add_argument("--max-batch", type=int, default=1024)
    w = sub.add_parser("whatif")
    w.add_argument("--out", required=True)
    w.add_argument("--example", default="gpt-medium-bf16-remat")
    w.add_argument("--fraction", type=float, default=0.25)
    w.add_argument("--devices", type=int, default=2)
    w.add_argument("--fsdp", type=int, nargs="+", default=[1, 2])
    w.add_argument(
        "--card",
        default="81080MiB",
        help="the card to plan for (default: an H100 80GB's CUDA total, bytes_limit / fraction; the "
        "2026-11-26 runs passed 81559MiB, nvidia-smi's figure, 479 MiB more)",
    )
    w.add_argument("--card-name", default="H100")
    w.add_argument("--only", nargs="+", choices=["real", "mock"])
    w.add_argument("--timeout", type=float, default=560)
    w.add_argument("--min-batch", type=int, default=1)
    w.add_argument("--max-batch", type=int, default=1024)
    w.add_argument("--no-verify", dest="verify", action="store_false", help="untuned compiles only")
    t = sub.add_parser("table")
    t.add_argument("folders", nargs="+", help="folders with a raw.jsonl each (e.g. one per machine)")
    args = parser.parse_args()
    return {"answers": answers_main, "whatif": whatif_main, "table": table_main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
