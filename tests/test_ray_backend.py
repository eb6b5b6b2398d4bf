"""The Ray backend of ``jaxfit schedule`` on a real local Ray (2 logical GPUs, 2 CPUs): no mocks.

Commands are small ``python -c`` scripts; Ray starts once for the module and is shut down at the end.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for_code

from jaxfit.errors import ConfigError
from jaxfit.schedule.backends.local import LaunchSpec, _is_runner, read_status
from jaxfit.schedule.backends.ray import RayLauncher, _make_task_function, ray_gpu_request

pytestmark = pytest.mark.slow  # real subprocesses and compiles

ray = pytest.importorskip("ray")

UP = "import time; print('up', flush=True); time.sleep(60)"
"""A script that says it runs, then sleeps a minute (unless stopped)."""


def _up(folder: Path, script: str = UP) -> list[str]:
    """The command running ``script``; the folder argument marks its processes as this test's."""
    return [sys.executable, "-c", script, str(folder)]


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (not zombies) that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """One local Ray with 2 logical GPUs and 2 CPUs for the whole module; no process outlives it."""
    launcher = RayLauncher(num_gpus=2, num_cpus=2)
    yield launcher
    launcher.close()
    assert not ray.is_initialized()
    base = str(tmp_path_factory.getbasetemp())  # every runner, guard and command names a path in it
    deadline = time.monotonic() + 10
    while _processes_mentioning(base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(base)


def _spec(
    folder: Path, name: str, command: list[str], *, share: float = 0.5, env: dict[str, str] | None = None
) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        attempt=1,
        command=tuple(command),
        env=env or {},
        log_path=str(folder / "logs" / f"{name}.log"),
        status_path=str(folder / f"{name}.status.json"),
        gpu=0,
        gpu_share=share,
        cwd=str(folder),
    )


def _wait_for_line(path: str, line: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and line in Path(path).read_text().splitlines():
            return
        time.sleep(0.05)
    raise AssertionError(f"{line!r} never appeared in {path}")


def test_runs_command_with_env_log_cwd_and_ray_gpu(launcher, tmp_path):
    script = (
        "import os, sys\n"
        "print('VAR', os.environ['JAXFIT_RAY_TEST'])\n"
        "print('CUDA', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
        "print('CWD', os.getcwd())\n"
        "print('OMP', os.environ.get('OMP_NUM_THREADS'))\n"
        "print('RAYJOB', os.environ.get('RAY_JOB_ID'))\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    spec = _spec(
        tmp_path,
        "env",
        [sys.executable, "-c", script],
        share=0.31,
        env={"JAXFIT_RAY_TEST": "hello ray", "CUDA_VISIBLE_DEVICES": "7"},
    )
    Path(spec.log_path).parent.mkdir()
    Path(spec.log_path).write_text("earlier attempt\n")
    handle = launcher.start(spec)
    assert wait_for_code(handle) == 0
    lines = Path(spec.log_path).read_text().splitlines()
    assert lines[0] == "earlier attempt"  # appended, like the local backend
    assert "VAR hello ray" in lines and "to stderr" in lines
    assert f"CWD {tmp_path}" in lines
    cuda = [line.split()[1] for line in lines if line.startswith("CUDA ")]
    assert cuda in (["0"], ["1"])  # Ray's GPU, not the plan's "7"
    assert f"OMP {os.environ.get('OMP_NUM_THREADS')}" in lines  # not Ray's worker default of 1
    assert "RAYJOB None" in lines
    assert read_status(spec.status_path) == 0
    assert isinstance(handle.pid, int)  # the runner ran on this host
    assert not _is_runner(handle.pid, spec.status_path)


def test_ray_packs_runs_by_gpu_share(launcher, tmp_path):
    """2 GPUs, 5 runs of 0.5: 4 run at once (2 per GPU), the 5th waits for one of them to end."""
    barrier = (
        "import glob, json, os, sys, time\n"
        "folder, me = sys.argv[1], sys.argv[2]\n"
        "start = time.time()\n"
        "open(os.path.join(folder, me + '.start'), 'w').close()\n"
        "deadline = start + 40\n"  # only reached if fewer than 4 run at once (the test then fails)
        "while len(glob.glob(os.path.join(folder, '*.start'))) < 4 and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "saw = len(glob.glob(os.path.join(folder, '*.start')))\n"
        "time.sleep(0.5)\n"
        "json.dump({'start': start, 'end': time.time(), 'saw': saw,\n"
        "           'gpu': os.environ['CUDA_VISIBLE_DEVICES']}, open(os.path.join(folder, me + '.json'), 'w'))\n"
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    handles = [
        launcher.start(_spec(tmp_path, f"r{i}", [sys.executable, "-c", barrier, str(marks), f"r{i}"])) for i in range(5)
    ]
    assert [wait_for_code(h, 90) for h in handles] == [0] * 5
    runs = sorted((json.loads((marks / f"r{i}.json").read_text()) for i in range(5)), key=lambda r: r["start"])
    first, fifth = runs[:4], runs[4]
    assert all(r["saw"] >= 4 for r in first), runs  # four ran at the same time...
    assert max(r["start"] for r in first) < min(r["end"] for r in first), runs
    assert sorted(r["gpu"] for r in first) == ["0", "0", "1", "1"], runs  # ...two per GPU
    assert fifth["start"] >= min(r["end"] for r in first), runs  # the fifth had to wait for a slot


def test_terminate_kill_and_cancel_before_start(launcher, tmp_path):
    # Two whole-GPU runs fill both GPUs; a third (half a GPU) waits in Ray's queue.
    a = _spec(tmp_path, "a", _up(tmp_path), share=1.0)
    b = _spec(tmp_path, "b", _up(tmp_path), share=1.0)
    c = _spec(tmp_path, "c", _up(tmp_path), share=0.5)
    ha, hb, hc = (launcher.start(s) for s in (a, b, c))
    _wait_for_line(a.log_path, "up")
    _wait_for_line(b.log_path, "up")
    assert ha.poll() is None and hb.poll() is None and hc.poll() is None
    assert isinstance(ha.pid, int) and isinstance(hb.pid, int)

    hc.terminate()  # never started: dropped from Ray's queue
    hc.terminate()  # asking twice is harmless
    assert wait_for_code(hc, 10) == -signal.SIGTERM
    assert not os.path.exists(c.log_path) and read_status(c.status_path) is None

    t0 = time.monotonic()
    ha.terminate()
    ha.terminate()
    assert wait_for_code(ha, 15) == -signal.SIGTERM  # the command died of the SIGTERM
    assert time.monotonic() - t0 < 8
    assert read_status(a.status_path) == -signal.SIGTERM
    assert not _is_runner(ha.pid, a.status_path)

    t0 = time.monotonic()
    hb.kill()
    assert wait_for_code(hb, 15) == -signal.SIGKILL
    assert time.monotonic() - t0 < 8
    assert not _is_runner(hb.pid, b.status_path)


def test_worker_death_stops_the_command(launcher, tmp_path):
    """A Ray worker killed under its task (as a force cancel on another node does) leaves no orphan:
    the guard sees it go and stops the command, which records its end."""
    spec = _spec(tmp_path, "orphan", _up(tmp_path))
    handle = launcher.start(spec)
    _wait_for_line(spec.log_path, "up")
    handle.poll()
    runner = handle.pid
    assert isinstance(runner, int)
    ray.cancel(handle.ref, force=True)  # kills the worker only, not the runner's group
    assert wait_for_code(handle, 20) == -signal.SIGTERM  # recorded by the runner: the guard SIGTERMed it
    assert read_status(spec.status_path) == -signal.SIGTERM
    deadline = time.monotonic() + 10  # the guard, runner and command are gone (or about to be)
    while _processes_mentioning(spec.status_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_mentioning(spec.status_path)
    assert not _is_runner(runner, spec.status_path)


def test_terminate_escalates_to_sigkill_after_grace(launcher, tmp_path):
    """A command that ignores SIGTERM is SIGKILLed after the grace (1 s on a second launcher)."""
    quick = RayLauncher(grace_s=1.0)  # joins the module's Ray
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    spec = _spec(tmp_path, "stubborn", _up(tmp_path, stubborn))
    handle = quick.start(spec)
    _wait_for_line(spec.log_path, "up")
    t0 = time.monotonic()
    handle.terminate()
    assert wait_for_code(handle, 15) == -signal.SIGKILL  # the runner was killed before recording anything
    assert 0.9 < time.monotonic() - t0 < 8
    assert read_status(spec.status_path) is None
    quick.close()
    assert ray.is_initialized()  # it did not start Ray, so it leaves it running


def test_nonzero_exit_codes_come_back(launcher, tmp_path):
    three = launcher.start(_spec(tmp_path, "three", [sys.executable, "-c", "import sys; sys.exit(3)"]))
    missing = _spec(tmp_path, "missing", [str(tmp_path / "no-such-program")])
    gone = launcher.start(missing)
    assert wait_for_code(three) == 3
    assert wait_for_code(gone) == 127  # the runner could not start the command
    assert "cannot start" in Path(missing.log_path).read_text()


def test_bad_share_and_gpu_request(launcher, tmp_path):
    with pytest.raises(ConfigError, match="GPU share"):
        launcher.start(_spec(tmp_path, "big", [sys.executable, "-c", "pass"], share=1.5))
    assert ray_gpu_request(0.5) == 0.5
    assert ray_gpu_request(1.0) == 1.0
    assert ray_gpu_request(1 / 3) == 0.3333  # rounded down: three thirds still fit one GPU
    assert ray_gpu_request(1e-6) == 0.0001
    assert ray_gpu_request(0.0) == 0.0
    assert launcher.adopt(os.getpid(), str(tmp_path / "x.json")) is None
    assert launcher.name == "ray" and launcher.resumable is False


def test_missing_ray_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ConfigError) as info:
        RayLauncher()
    assert str(info.value) == "the ray backend needs ray: pip install 'jaxfit[ray]'"


def test_workers_never_import_jaxfit():
    """The task is pickled by value: unpickling it where jaxfit cannot be imported works."""
    data = ray.cloudpickle.dumps(_make_task_function())
    load = (
        "import pickle, sys\n"
        "class Block:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'jaxfit':\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block)\n"
        "print(pickle.loads(sys.stdin.buffer.read()).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", load], input=data, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "jaxfit_attempt"
    assert pickle.loads(data).__name__ == "jaxfit_attempt"


def test_importing_the_backend_does_not_import_ray():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, jaxfit.schedule.backends.ray; print('ray' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr
