#!/usr/bin/env python3
"""Benchmark ``jaxfit schedule --backend ray`` on a Ray cluster of several nodes on one GPU host.

Issue 22's GPU check: a head node with no GPU (where the scheduler runs) and ``--nodes`` worker
nodes of ``--gpus-per-node`` GPUs each, every node started by ``ray start`` with its own
``CUDA_VISIBLE_DEVICES`` slice and its own ``TMPDIR`` (so nothing is shared by accident but the
machine itself). A queue of six real ``scripts/train.py`` runs (two FSDP-2 runs that take two GPUs
each, fitted and pinned; four one-GPU runs at a given batch and fraction) is scheduled across the cluster with
``--ray-address``. Once ``--stop-after`` runs have started (and ``--stop-delay`` seconds more),
the last worker node is killed (every process of it: its raylet, workers, and the runs it holds),
as a node that dies; its runs must finish on the node that is left.

    python benchmarks/bench_ray_cluster.py --out DIR            # on a host with nodes x gpus-per-node GPUs
    BENCH_SMOKE=1 python benchmarks/bench_ray_cluster.py --out DIR   # on a CPU: logical GPUs, tiny runs

Writes ``DIR/result.json`` and ``DIR/table.md``: each run's node, attempts and outcomes, its
planned and measured peak (``peak_bytes_in_use`` printed by ``scripts/train.py``), the makespan
against the lower bound ``max(longest run, GPU-seconds of work / GPUs)``, out-of-memory count, the
per-GPU nvidia-smi maxima, and whether any process of the cluster outlived it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = bool(os.environ.get("BENCH_SMOKE"))
MARK = "JAXFIT_BENCH_RAY_NODE"
GIB = 1 << 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked(value_prefix: str) -> set[int]:
    """Processes whose environment has ``MARK=<value_prefix>...``, and all their descendants."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                continue
            parents[int(entry.name)] = int(stat[1])
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(f"{MARK}={value_prefix}".encode()):
                    found.add(int(entry.name))
                    break
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found


def _kill(value_prefix: str) -> int:
    pids = _marked(value_prefix)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def _ray_cli() -> str:
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def start_cluster(nodes: int, gpus_per_node: int, tag: str, log: Path) -> tuple[str, list[str]]:
    """``ray start --head`` (no GPU) and ``nodes`` worker nodes; the address and the nodes' TMPDIRs."""
    base = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    head_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths are limited
    port = _free_port()
    common = ["--disable-usage-stats", f"--num-cpus={4 if SMOKE else 8}"]
    with open(log, "a") as f:
        subprocess.run(
            [_ray_cli(), "start", "--head", f"--port={port}", "--num-gpus=0", "--include-dashboard=false",
             f"--temp-dir={head_tmp}", *common],
            env=dict(base, **{MARK: f"{tag}-head"}), check=True, stdout=f, stderr=subprocess.STDOUT, timeout=180,
        )  # fmt: skip
        address = f"127.0.0.1:{port}"
        tmps = []
        for n in range(nodes):
            node_tmp = tempfile.mkdtemp(prefix=f"rn{n}", dir="/tmp")
            env = dict(base, TMPDIR=node_tmp, **{MARK: f"{tag}-node{n}"})
            if not SMOKE:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(n * gpus_per_node + i) for i in range(gpus_per_node))
            subprocess.run(
                [_ray_cli(), "start", f"--address={address}", f"--num-gpus={gpus_per_node}", *common],
                env=env, check=True, stdout=f, stderr=subprocess.STDOUT, timeout=180,
            )  # fmt: skip
            tmps.append(node_tmp)
    return address, [head_tmp, *tmps]


def _nodes(address: str) -> list[dict]:
    """Alive nodes with their GPUs, from a short driver of its own (the scheduler's is separate)."""
    code = (
        f"import json, ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False);"
        "print(json.dumps([{'id': n['NodeID'], 'gpus': n['Resources'].get('GPU', 0), 'alive': n['Alive']}"
        " for n in ray.nodes()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, RAY_AUTH_MODE="disabled"),
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []


TRAIN = [sys.executable, "scripts/train.py"]
COMMON = ["--no-wandb-enabled", "--overwrite", "--save-interval=100000", "--log-interval=50"]


def write_queue(out: Path) -> Path:
    import yaml

    # (name, config, steps, batch, fraction, gpus): two FSDP-2 runs fitted and pinned (the largest
    # batch under a given fraction, at most --max-batch 64: untuned rounds and one or two autotuned
    # ones; the second's fit reads the first's compiles from the cache, the same program) and four
    # one-GPU runs at a given batch and fraction (settings bench_schedule.py ran on an H100).
    # gpt_small_bf16_remat is no FSDP-2 run for a bench: its autotuned peaks under a tight limit are
    # erratic (batch 134: 15.3 GiB untuned, 29.4 GiB autotuned) and its fraction search (call2) and
    # batch search (call3, 9 rounds, about 400 s) each used up a call (results/h100x4/ray/).
    runs = [
        ("fsdp2-a", "gpt_small", 200, "auto", 0.2, 2),
        ("fsdp2-b", "gpt_small", 150, "auto", 0.2, 2),
        ("gpt-a", "gpt_small", 200, 8, 0.16, 1),
        ("gpt-b", "gpt_small", 150, 8, 0.16, 1),
        ("vit-a", "vit_small", 200, 64, 0.1, 1),
        ("vit-b", "vit_small", 150, 64, 0.1, 1),
    ]
    if SMOKE:
        runs = [
            (
                n,
                "debug" if c.startswith("gpt") else "debug_vit",
                40,
                8 if b != "auto" else b,
                f if b != "auto" else 0.05,
                g,
            )
            for n, c, _, b, f, g in runs
        ]
    experiments = []
    for name, config, steps, batch, fraction, gpus in runs:
        command = [
            *TRAIN,
            config,
            f"--exp-name={name}",
            f"--num-train-steps={steps}",
            f"--checkpoint-base-dir=/tmp/jaxfit-bench-ck/{name}",
            *COMMON,
        ]
        entry: dict = {"name": name, "command": command, "batch": batch, "fraction": fraction, "retries": 2}
        if gpus > 1:
            entry["command"] = [*command, f"--fsdp-devices={gpus}"]
            entry["gpus"] = gpus
            if SMOKE:  # logical GPUs compute on the CPU: give the run as many host devices
                entry["env"] = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={gpus}"}
        experiments.append(entry)
    queue = {"reserve": "1GiB", "experiments": experiments}
    path = out / "queue.yaml"
    path.write_text(yaml.safe_dump(queue, sort_keys=False))
    return path


def _peak_in_log(path: Path) -> tuple[int | None, int | None]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, None
    found = re.findall(r"memory: peak_bytes_in_use=(\d+) bytes_limit=(\d+)", text)
    return (int(found[-1][0]), int(found[-1][1])) if found else (None, None)


def _smi_maxima(path: Path) -> dict[str, float]:
    top: dict[str, float] = {}
    try:
        for line in path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[1].isdigit():
                used = float(parts[2].split()[0])
                top[parts[1]] = max(top.get(parts[1], 0.0), used)
    except (OSError, ValueError):
        pass
    return top


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=4, help="kill the last node once this many runs started")
    parser.add_argument("--stop-delay", type=float, default=20.0, help="seconds after that before the kill")
    parser.add_argument("--budget", type=float, default=540.0, help="stop the schedule after this many seconds")
    parser.add_argument(
        "--plan-on-cluster", action="store_true", help="plan on a worker node (jaxfit schedule --plan-on-cluster)"
    )
    args = parser.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    started = time.time()
    smi = None
    if not SMOKE:
        with open(out / "smi.csv", "w") as smi_file:
            smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,index,memory.used", "--format=csv,noheader", "-l", "1"],
                stdout=smi_file,
                stderr=subprocess.STDOUT,
            )
    folders: list[str] = []
    result: dict = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "smoke": SMOKE}
    try:
        address, folders = start_cluster(args.nodes, args.gpus_per_node, tag, out / "cluster.log")
        result["cluster_start_seconds"] = round(time.time() - started, 1)
        result["nodes_at_start"] = _nodes(address)
        print(f"cluster up at {address} in {result['cluster_start_seconds']} s: {result['nodes_at_start']}", flush=True)
        queue = write_queue(out)
        logical = ["--gpus", str(args.nodes * args.gpus_per_node), "--device-memory", "16GiB"] if SMOKE else []
        command = [
            sys.executable, "-m", "jaxfit.cli", "schedule", str(queue), *logical,
            "--backend", "ray", "--ray-address", address,
            "--state-dir", str(out / "state"), "--json", str(out / "schedule.json"),
            "--monitor-interval", "1", "--max-batch", "64",
            "--probe-arg=--checkpoint-base-dir=/tmp/jaxfit-bench-probe",
            *(["--plan-on-cluster"] if args.plan_on_cluster else []),
        ]  # fmt: skip
        env = dict(
            os.environ,
            RAY_AUTH_MODE="disabled",
            JAXFIT_CACHE_DIR=str(out / "cache"),
            PYTHONUNBUFFERED="1",
            WANDB_MODE="disabled",
        )
        schedule_log = out / "schedule.log"
        begun = time.time()
        with open(schedule_log, "w") as log_file:
            proc = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )
        victim = f"{tag}-node{args.nodes - 1}"
        stop: dict = {}

        def stop_node() -> None:
            while proc.poll() is None:
                text = schedule_log.read_text(errors="replace")
                if len(re.findall(r"\bstarted\b.*attempt 1 ", text)) >= args.stop_after:
                    time.sleep(args.stop_delay)
                    if proc.poll() is not None:
                        return
                    stop["at"] = round(time.time() - begun, 1)
                    stop["processes_killed"] = _kill(victim)
                    print(f"stopped node {args.nodes - 1} at {stop['at']} s ({stop['processes_killed']} processes)")
                    return
                time.sleep(1)

        watcher = threading.Thread(target=stop_node, daemon=True)
        watcher.start()
        try:
            code = proc.wait(timeout=args.budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        result["schedule_exit"] = code
        result["schedule_seconds"] = round(time.time() - begun, 1)
        result["node_stop"] = stop
        result["nodes_at_end"] = _nodes(address)
    finally:
        for part in ("node", "head"):  # workers first, then the head
            for n in range(args.nodes + 1):
                _kill(f"{tag}-{part}{n}" if part == "node" else f"{tag}-head")
        deadline = time.time() + 15
        while _marked(tag) and time.time() < deadline:
            time.sleep(0.3)
        result["left_running"] = sorted(_marked(tag))
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        if smi is not None:
            smi.terminate()
    summarize(out, result)
    return 0 if result.get("schedule_exit") == 0 and not result["left_running"] else 1


def summarize(out: Path, result: dict) -> None:
    sys.path.insert(0, str(REPO))
    from jaxfit.schedule.state import StateStore

    try:
        data = json.loads((out / "schedule.json").read_text())
    except (OSError, ValueError):
        data = {"experiments": []}
    attempts: dict[str, list] = {}
    planned: dict[str, dict] = {}
    total = None
    store_path = out / "state" / "state.sqlite"
    if store_path.exists():
        store = StateStore(store_path)
        for a in store.attempts():
            attempts.setdefault(a.name, []).append({"attempt": a.attempt, "outcome": a.outcome, "exit": a.exit_code})
        planned = {r["name"]: r for r in store.meta("runs") or []}
        total = ((store.meta("plan") or {}).get("gpus") or [{}])[0].get("total_bytes")
        store.close()
    rows = []
    gpu_seconds = 0.0
    longest = 0.0
    for e in data.get("experiments", []):
        log = Path(e.get("log_path") or "")
        peak, limit = _peak_in_log(log)
        try:
            m = re.search(r"ran on Ray node (\w+)", log.read_text(errors="replace"))
            node = m.group(1)[:8] if m else None
        except OSError:
            node = None
        gpus = len(e.get("gpus") or [0])
        seconds = e.get("duration_seconds")
        share = min(1.0, e["need_bytes"] / total) if total else 1.0
        if seconds:
            longest = max(longest, seconds)
            gpu_seconds += seconds * (gpus if gpus > 1 else share)
        rows.append(
            {
                "name": e["name"],
                "state": e.get("state"),
                "node": node,
                "gpus": gpus,
                "batch": e.get("batch_size"),
                "fraction": e.get("mem_fraction"),
                "planned_peak_bytes": (planned.get(e["name"]) or {}).get("peak_bytes"),
                "need_bytes": e.get("need_bytes"),
                "measured_peak_bytes": peak,
                "limit_bytes": limit,
                "pinned": e.get("program_pinned"),
                "pinned_step": e.get("pinned_step"),
                "attempts": attempts.get(e["name"], []),
                "seconds_first_start_to_end": seconds,
            }
        )
    ends = [e["ended_at"] for e in data.get("experiments", []) if e.get("ended_at")]
    starts = [e["started_at"] for e in data.get("experiments", []) if e.get("started_at")]
    makespan = (max(ends) - min(starts)) if ends and starts else None
    capacity = result["nodes"] * result["gpus_per_node"]
    bound = max(longest, gpu_seconds / capacity) if longest else None
    ooms = sum(1 for r in rows for a in r["attempts"] if a["outcome"] == "oom")
    result.update(
        rows=rows,
        makespan_seconds=round(makespan, 1) if makespan else None,
        lower_bound_seconds=round(bound, 1) if bound else None,
        out_of_memory_attempts=ooms,
        smi_max_mib=_smi_maxima(out / "smi.csv"),
    )
    (out / "result.json").write_text(json.dumps(result, indent=2))
    lines = [
        "| run | GPUs | node | batch | fraction | planned peak | measured peak (JAX) | pinned | attempts | s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:

        def gib(v: int | None) -> str:
            return f"{v / GIB:.2f} GiB" if v else "n/a"

        tries = ", ".join(f"{a['attempt']}: {a['outcome'] or 'running'}" for a in r["attempts"])
        fraction = f"{r['fraction']:.3f}" if r["fraction"] else "n/a"
        lines.append(
            f"| {r['name']} | {r['gpus']} | {r['node']} | {r['batch']} | {fraction} | "
            f"{gib(r['planned_peak_bytes'])} | {gib(r['measured_peak_bytes'])} of {gib(r['limit_bytes'])} | "
            f"{r['pinned']} | {tries} | {r['seconds_first_start_to_end']} |"
        )
    lines += [
        "",
        f"- makespan {result['makespan_seconds']} s against the lower bound {result['lower_bound_seconds']} s "
        f"(max of the longest run and GPU-seconds of work / {capacity} GPUs); schedule wall "
        f"{result.get('schedule_seconds')} s with planning; exit {result.get('schedule_exit')}",
        f"- node stopped: {result.get('node_stop')}; nodes alive at the end: "
        f"{sum(1 for n in result.get('nodes_at_end', []) if n.get('alive'))}",
        f"- out-of-memory attempts: {ooms}; nvidia-smi max MiB per GPU: {result['smi_max_mib']}",
        f"- processes of the cluster left running: {result['left_running']}",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
