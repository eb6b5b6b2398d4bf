"""jaxfit schedule (execution): real child processes on logical GPUs, faults, SIGKILL and --resume.

The commands are ``tests/fixtures/fake_train.py`` (no JAX: it records how it was started and can
sleep, crash, hang or fail like an out-of-memory JAX step) so that every test takes seconds; the
real ``scripts/train.py`` runs under the scheduler in ``test_schedule_runs_train_py_with_wandb_group``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, error_line

pytestmark = pytest.mark.slow  # real subprocesses and compiles

FAKE = str(FIXTURES / "fake_train.py")
TRAIN = str(REPO / "scripts" / "train.py")
LOGICAL = ["--gpus", "1", "--device-memory", "8GiB", "--grace", "2", "--monitor-interval", "0.2", "--quiet"]


def _queue(folder: Path, experiments: list[dict], **top) -> Path:
    data = {
        "gpus": 1,
        "reserve": "0",
        "device_memory": "8GiB",
        "process_overhead": "0",
        **top,
        "experiments": experiments,
    }
    path = folder / "queue.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _fake(name: str, *flags: str, batch: int = 16, fraction: float = 0.3, **keys) -> dict:
    return {
        "name": name,
        "command": [sys.executable, FAKE, f"--exp-name={name}", *flags],
        "batch": batch,
        "fraction": fraction,
        **keys,
    }


def _env(out: Path) -> dict[str, str]:
    env = dict(os.environ, FAKE_TRAIN_OUT=str(out), WANDB_MODE="disabled")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _schedule(
    folder: Path, *args: str, timeout: float = 120, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**_env(folder / "out"), **(extra_env or {})},
        timeout=timeout,
    )


def _records(folder: Path) -> dict[str, list[dict]]:
    """What each fake run recorded, per experiment, in start order."""
    out: dict[str, list[dict]] = {}
    for path in sorted((folder / "out").glob("*.json")):
        data = json.loads(path.read_text())
        out.setdefault(data["exp"], []).append(data)
    for runs in out.values():
        runs.sort(key=lambda r: r["start"])
    return out


def _result(folder: Path) -> dict[str, dict]:
    return {e["name"]: e for e in json.loads((folder / "result.json").read_text())["experiments"]}


def test_runs_share_a_gpu_and_the_last_waits_for_memory(tmp_path):
    # Three runs at 0.3 of 8 GiB fit together; a fourth does not (0.9 + 0.3 > 1) and waits.
    _queue(tmp_path, [_fake(n, "--sleep=2") for n in ("a", "b", "c", "d")])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result, records = _result(tmp_path), _records(tmp_path)
    assert {n: r["state"] for n, r in result.items()} == dict.fromkeys("abcd", "done")
    for row in result.values():
        assert (row["gpu"], row["mem_fraction"], row["batch_size"], row["attempts"]) == (0, 0.3, 16, 1)
        assert row["started_at"] < row["ended_at"]
    first = {n: records[n][0] for n in "abc"}
    latest_start = max(r["start"] for r in first.values())
    assert latest_start < min(r["end"] for r in first.values()), "a, b and c did not run at the same time"
    assert records["d"][0]["start"] >= min(r["end"] for r in first.values()), "d started before memory freed"
    env = records["a"][0]["env"]
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert env["JAX_PLATFORMS"] == "cpu"  # logical GPUs: the runs compute on the CPU
    assert env["WANDB_RUN_GROUP"].startswith("queue-")
    state_dir = tmp_path / "jaxfit-runs" / "queue"
    assert (state_dir / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (state_dir / "logs").glob("*.log")) == [f"{n}.1.log" for n in "abcd"]
    with sqlite3.connect(state_dir / "state.sqlite") as db:
        per_run = db.execute("SELECT COUNT(*) FROM samples WHERE name IS NOT NULL").fetchone()[0]
    assert per_run > 0, "the monitor recorded no per-run memory"


def test_out_of_memory_retries_with_more_accumulation_and_the_same_global_batch(tmp_path):
    _queue(tmp_path, [_fake("big", "--oom-above=4", batch=16, retries=0)])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    runs = _records(tmp_path)["big"]
    assert [(r["batch_size"], r["grad_accum_steps"]) for r in runs] == [(16, 1), (16, 2), (16, 4)]
    assert [r["outcome"] for r in runs] == ["oom", "oom", "done"]
    row = _result(tmp_path)["big"]
    assert (row["state"], row["attempts"], row["batch_size"], row["grad_accum_steps"], row["micro_batch_size"]) == (
        "done",
        3,
        16,
        4,
        4,
    )


def test_out_of_memory_at_micro_batch_one_fails_with_a_reason(tmp_path):
    _queue(tmp_path, [_fake("huge", "--oom-above=0", batch=2)])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 1, proc.stderr + proc.stdout
    row = _result(tmp_path)["huge"]
    assert row["state"] == "failed" and row["attempts"] == 2 and "micro-batch 1" in row["reason"]


def test_a_run_that_does_not_hold_the_pool_it_was_given_fails_once_with_the_reason(tmp_path):
    """jaxfit's start-up hook compares the run's GPU pool with the one it was given before the first
    step (``$JAXFIT_POOL_BYTES``; on a GPU the scheduler sets it). Here the queue sets it on a run
    whose jax is on the CPU, as a run with both spellings of the fraction is: the run is stopped
    at its first jitted call, and no retry is spent on what another attempt cannot change. (A queue's
    env may not set it: the variable reaches the run from the scheduler's own environment here.)"""
    _queue(tmp_path, [_fake("a", "--jit", retries=2)])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json", extra_env={"JAXFIT_POOL_BYTES": str(3 << 30)})
    assert proc.returncode == 1, proc.stderr + proc.stdout
    row = _result(tmp_path)["a"]
    assert (row["state"], row["attempts"]) == ("failed", 1)
    assert row["reason"].startswith("jax started on the CPU, not the GPU jaxfit planned for")
    (run,) = _records(tmp_path)["a"]
    assert "jitted" not in run  # stopped before its jitted call ran


def test_crashes_are_retried_up_to_the_limit(tmp_path):
    _queue(tmp_path, [_fake("flaky", "--fail-times=1", retries=1), _fake("broken", "--fail-times=9", retries=2)])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 1
    result = _result(tmp_path)
    assert (result["flaky"]["state"], result["flaky"]["attempts"]) == ("done", 2)
    assert (result["broken"]["state"], result["broken"]["attempts"], result["broken"]["exit_code"]) == ("failed", 3, 3)
    assert "no retries left" in proc.stdout + proc.stderr


def test_a_hung_run_is_stopped_at_its_timeout(tmp_path):
    _queue(tmp_path, [_fake("stuck", "--hang", timeout="1s"), _fake("fine", "--sleep=0.2")])
    started = time.time()
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert time.time() - started < 60
    assert proc.returncode == 1
    result = _result(tmp_path)
    assert result["stuck"]["state"] == "timeout" and result["stuck"]["attempts"] == 1
    assert result["fine"]["state"] == "done"
    (record,) = _records(tmp_path)["stuck"]
    assert record["end"] is None  # killed, never finished by itself
    with pytest.raises(ProcessLookupError):
        os.kill(record["pid"], 0)


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def _states(folder: Path) -> dict[str, str]:
    path = folder / "jaxfit-runs" / "queue" / "state.sqlite"
    if not path.exists():
        return {}
    try:
        with sqlite3.connect(path) as db:
            return dict(db.execute("SELECT name, state FROM experiments").fetchall())
    except sqlite3.OperationalError:
        return {}


def _start_scheduler(folder: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "schedule", "queue.yaml", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(folder / "out"),
    )


@pytest.mark.parametrize("ended_meanwhile", [False, True], ids=["adopts-a-live-run", "reads-a-run-that-ended"])
def test_sigkill_of_the_scheduler_then_resume_reruns_nothing_finished(tmp_path, ended_meanwhile):
    # quick finishes at once; long is running when the scheduler dies; later waits for memory.
    _queue(
        tmp_path,
        [
            _fake("quick", "--sleep=0.1", fraction=0.3),
            _fake("long", "--sleep=4", fraction=0.6),
            _fake("later", "--sleep=0.1", fraction=0.6),
        ],
    )
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    _wait_for(lambda: _states(tmp_path).get("quick") == "done" and _states(tmp_path).get("long") == "running")
    scheduler.send_signal(signal.SIGKILL)
    scheduler.communicate(timeout=30)
    assert _states(tmp_path)["later"] == "pending"
    if ended_meanwhile:  # long ends with no scheduler alive; its runner still records the exit code
        status = tmp_path / "jaxfit-runs" / "queue" / "logs" / "long.1.status.json"
        _wait_for(lambda: status.exists())
        assert json.loads(status.read_text())["exit_code"] == 0
        assert _states(tmp_path)["long"] == "running"  # nobody has read it yet

    proc = _schedule(tmp_path, "--resume", "--json", "result.json", "--grace", "2", "--quiet")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    records, result = _records(tmp_path), _result(tmp_path)
    assert {n: len(r) for n, r in records.items()} == {"quick": 1, "long": 1, "later": 1}, "something ran twice"
    assert {n: (r["state"], r["attempts"]) for n, r in result.items()} == {
        "quick": ("done", 1),
        "long": ("done", 1),
        "later": ("done", 1),
    }
    assert records["later"][0]["start"] >= records["long"][0]["end"]  # it still waited for the memory
    logs = tmp_path / "jaxfit-runs" / "queue" / "logs"
    assert "done" in (logs / "long.1.log").read_text()  # the adopted run's log is complete
    assert sorted(p.name for p in logs.glob("*.log")) == ["later.1.log", "long.1.log", "quick.1.log"]


def test_sigterm_stops_runs_gracefully_and_resume_finishes_them(tmp_path):
    # 30 s on the first start (SIGTERM comes long before), 0.5 s on the resumed one
    experiments = [_fake(n, "--sleep=30", "--later-sleep=0.5") for n in ("slow", "other")]
    _queue(tmp_path, experiments)
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    _wait_for(lambda: set(_states(tmp_path).values()) == {"running"} and len(_records(tmp_path)) == 2)
    scheduler.send_signal(signal.SIGTERM)
    out, err = scheduler.communicate(timeout=60)
    assert scheduler.returncode == 128 + signal.SIGTERM, err
    assert _states(tmp_path) == {"slow": "interrupted", "other": "interrupted"}
    assert "--resume" in out
    line = error_line(_schedule(tmp_path, *LOGICAL))  # an unfinished schedule is never started over
    assert "holds an unfinished schedule (2 interrupted)" in line and "--resume" in line
    for runs in _records(tmp_path).values():
        with pytest.raises(ProcessLookupError):
            os.kill(runs[0]["pid"], 0)  # no child left behind

    _queue(tmp_path, experiments)  # the stored plan wins
    proc = _schedule(tmp_path, "--resume", "--json", "result.json", "--quiet", timeout=120)
    # The stored commands run again (0.5 s, as started a second time): the resumed attempts are the second ones.
    assert proc.returncode == 0, proc.stderr
    assert {n: r["attempts"] for n, r in _result(tmp_path).items()} == {"slow": 2, "other": 2}


def test_bad_schedule_input_is_one_line(tmp_path):
    _queue(tmp_path, [_fake("a", "--sleep=0")])
    assert "no schedule to resume" in error_line(_schedule(tmp_path, "--resume"))
    assert "exclude each other" in error_line(_schedule(tmp_path, "--resume", "--dry-run"))
    assert "--grace" in error_line(_schedule(tmp_path, *LOGICAL, "--grace", "-1"))
    assert _schedule(tmp_path, *LOGICAL).returncode == 0
    again = _schedule(tmp_path, *LOGICAL)  # a finished schedule is moved aside, not overwritten
    assert again.returncode == 0, again.stderr
    (archived,) = (tmp_path / "jaxfit-runs").glob("queue-2*")
    assert (archived / "state.sqlite").exists() and (archived / "logs" / "a.1.log").exists()
    assert str(archived) in again.stdout
    proc = _schedule(tmp_path, *LOGICAL, "--backend", "nope")  # tyro's own usage error
    assert proc.returncode == 2 and "'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_schedule_runs_train_py_with_wandb_group(tmp_path):
    """scripts/train.py under the scheduler: WandB (offline) gets the group and the scheduled settings."""
    from wandb_offline import wandb_records

    command = [
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=sched",
        "--num-train-steps=3",
        "--overwrite",
        f"--checkpoint-base-dir={tmp_path / 'ckpt'}",
    ]
    _queue(
        tmp_path,
        [
            {
                "name": "sched",
                "command": command,
                "batch": 8,
                "fraction": 0.2,
                "global_batch": 16,
                "env": {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)},
            }
        ],
    )
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json", "--wandb-group", "my-group", timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    row = _result(tmp_path)["sched"]
    assert (row["batch_size"], row["grad_accum_steps"], row["micro_batch_size"]) == (16, 2, 8)
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    groups, config = set(), {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "run":
            groups.add(record.run.run_group)
        if record.WhichOneof("record_type") in ("run", "config"):
            items = record.run.config.update if record.WhichOneof("record_type") == "run" else record.config.update
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items})
    assert "my-group" in groups
    settings = config["jaxfit"]
    assert (settings["scheduled"], settings["batch_size"], settings["grad_accum_steps"], settings["mem_fraction"]) == (
        True,
        16,
        2,
        0.2,
    )
    log = (tmp_path / "jaxfit-runs" / "queue" / "logs" / "sched.1.log").read_text()
    assert "batch_size=16" in log or "batch 16" in log, log[-2000:]


def test_the_ray_backend_runs_the_plan_with_fractional_gpus(tmp_path):
    """--backend ray on a local Ray with one logical GPU: each run a task of num_gpus = its share."""
    pytest.importorskip("ray")
    _queue(tmp_path, [_fake(n, "--sleep=3") for n in ("a", "b", "c")] + [_fake("d", "--fail-times=1", retries=1)])
    proc = _schedule(tmp_path, *LOGICAL, "--backend", "ray", "--json", "result.json", timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result, records = _result(tmp_path), _records(tmp_path)
    assert {n: (r["state"], r["attempts"]) for n, r in result.items()} == {
        "a": ("done", 1),
        "b": ("done", 1),
        "c": ("done", 1),
        "d": ("done", 2),
    }
    first = [records[n][0] for n in "abc"]
    assert max(r["start"] for r in first) < min(r["end"] for r in first), "the three shares did not run together"
    assert {r["env"]["CUDA_VISIBLE_DEVICES"] for r in first} == {"0"}  # Ray's GPU, not the plan's variable
    assert all(r["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3" for r in first)


def test_a_second_scheduler_cannot_run_the_same_schedule(tmp_path):
    _queue(tmp_path, [_fake("slow", "--sleep=20")])
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    try:
        _wait_for(lambda: _states(tmp_path).get("slow") == "running")
        line = error_line(_schedule(tmp_path, "--resume", "--quiet"))
        assert "is being run by jaxfit (pid" in line
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.communicate(timeout=60)
    assert _states(tmp_path) == {"slow": "interrupted"}


def test_a_run_that_ends_takes_its_workers_with_it(tmp_path):
    """Workers a run leaves behind (a crashed run's data loader) end with it: the runner ends its group."""
    _queue(tmp_path, [_fake("w", "--leave-worker", "--fail-times=1", retries=0)])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 1 and _result(tmp_path)["w"]["state"] == "failed"
    (record,) = _records(tmp_path)["w"]
    time.sleep(0.5)
    assert not _alive(record["worker_pid"]), "the run's worker outlived it"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_resume_gives_a_run_that_ended_meanwhile_the_end_time_its_runner_recorded(tmp_path):
    _queue(tmp_path, [_fake("short", "--sleep=1.5")])
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    _wait_for(lambda: _states(tmp_path).get("short") == "running")
    scheduler.send_signal(signal.SIGKILL)
    scheduler.communicate(timeout=30)
    status = tmp_path / "jaxfit-runs" / "queue" / "logs" / "short.1.status.json"
    _wait_for(lambda: status.exists())
    time.sleep(3)  # the scheduler comes back well after the run ended
    proc = _schedule(tmp_path, "--resume", "--json", "result.json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    row = _result(tmp_path)["short"]
    assert row["ended_at"] == pytest.approx(json.loads(status.read_text())["ended_at"])
    assert row["duration_seconds"] < 3.5, row
    with sqlite3.connect(tmp_path / "jaxfit-runs" / "queue" / "state.sqlite") as db:
        texts = [t for (t,) in db.execute("SELECT text FROM events WHERE kind = 'adopted'")]
    assert texts and "while no scheduler was running (exit code 0)" in texts[0]


def test_a_queues_env_values_stay_out_of_the_state_and_the_json(tmp_path):
    secret = "sk-test-0123456789"
    _queue(tmp_path, [_fake("a", "--sleep=0", env={"WANDB_API_KEY": secret, "EXTRA": "x"})])
    proc = _schedule(tmp_path, *LOGICAL, "--json", "result.json")
    assert proc.returncode == 0, proc.stderr
    assert _records(tmp_path)["a"][0]["env"]["EXTRA"] == "x"  # the run itself got them
    state = (tmp_path / "jaxfit-runs" / "queue" / "state.sqlite").read_bytes()
    assert secret.encode() not in state and secret not in (tmp_path / "result.json").read_text()
    assert _result(tmp_path)["a"]["env"] == ["EXTRA", "WANDB_API_KEY"]


def test_resume_takes_env_values_from_the_queue_file(tmp_path):
    # 30 s on the first start (SIGTERM comes long before); the resumed start runs the stored command, 0.5 s
    _queue(tmp_path, [_fake("slow", "--sleep=30", "--later-sleep=0.5", env={"EXTRA": "from-the-file"})])
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    _wait_for(lambda: _states(tmp_path).get("slow") == "running" and "slow" in _records(tmp_path))
    scheduler.send_signal(signal.SIGTERM)
    scheduler.communicate(timeout=60)
    _queue(tmp_path, [_fake("slow", "--sleep=0", env={})])  # the file no longer gives the value
    assert "sets EXTRA in its env" in error_line(_schedule(tmp_path, "--resume"))
    _queue(tmp_path, [_fake("slow", "--sleep=0", env={"EXTRA": "from-the-file"})])
    assert _schedule(tmp_path, "--resume", "--quiet").returncode == 0
    assert _records(tmp_path)["slow"][-1]["env"]["EXTRA"] == "from-the-file"


def test_schedule_input_that_cannot_work_is_refused_before_any_run(tmp_path):
    _queue(
        tmp_path,
        [
            _fake("a", "--sleep=0"),
            {"name": "b", "command": ["no-such-trainer-jaxfit", "x"], "batch": 8, "fraction": 0.2},
        ],
    )
    assert "experiment 'b': command not found: 'no-such-trainer-jaxfit'" in error_line(_schedule(tmp_path, *LOGICAL))
    assert not (tmp_path / "out").exists(), "a run started"
    _queue(tmp_path, [_fake("a", "--sleep=0")])
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert "--state-dir" in error_line(_schedule(tmp_path, *LOGICAL, "--state-dir", str(blocker / "state")))
    assert "--timeline" in error_line(_schedule(tmp_path, *LOGICAL, "--timeline", "missing/t.png"))
    assert "--json" in error_line(_schedule(tmp_path, *LOGICAL, "--json", str(blocker / "r.json")))


@pytest.mark.parametrize("resume", [False, True])
def test_a_corrupt_state_file_is_one_line(tmp_path, resume):
    _queue(tmp_path, [_fake("a", "--sleep=0")])
    state = tmp_path / "jaxfit-runs" / "queue"
    state.mkdir(parents=True)
    (state / "state.sqlite").write_bytes(b"garbage" * 1000)
    line = error_line(_schedule(tmp_path, *LOGICAL, *(["--resume"] if resume else [])))
    assert "is not a readable jaxfit state" in line and "--state-dir" in line
    assert (state / "state.sqlite").read_bytes() == b"garbage" * 1000  # state is never replaced


def test_a_second_scheduler_without_resume_is_told_it_is_running(tmp_path):
    _queue(tmp_path, [_fake("slow", "--sleep=20")])
    scheduler = _start_scheduler(tmp_path, *LOGICAL)
    try:
        _wait_for(lambda: _states(tmp_path).get("slow") == "running")
        line = error_line(_schedule(tmp_path, *LOGICAL))
        assert "is being run by jaxfit right now (pid" in line and "--resume" in line
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.communicate(timeout=60)
