"""The memory monitor: host fallback on real processes, NVML absent on a CPU machine, peaks, errors.

No mocks: a real child process in its own session holds memory, the monitor thread samples it
into a real SQLite state file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from jaxfit.errors import ConfigError
from jaxfit.schedule.monitor import OTHER, Monitor, experiment_peaks, gpu_peaks, group_rss
from jaxfit.schedule.state import Sample, StateStore

pytestmark = pytest.mark.slow  # real subprocesses and compiles

MB = 1 << 20

# Allocates ~200 MB, touches every page (so it is resident), says so, then sleeps; it also starts a
# grandchild in its process group that holds ~40 MB, so the group sum is more than the leader.
HOLDER = r"""
import subprocess, sys, time

kid = subprocess.Popen([sys.executable, "-c",
    "import time; b = bytearray(40 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE)
kid.stdout.readline()
data = bytearray(200 << 20)
for i in range(0, len(data), 4096):
    data[i] = 1
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder():
    """A process group (leader + one child) holding ~240 MB; killed as a group afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
def store(tmp_path):
    s = StateStore(tmp_path / "state.sqlite")
    yield s
    s.close()


def test_host_fallback_samples_a_process_group(holder, store):
    owners = {holder.pid: ("exp-a", 0)}
    monitor = Monitor(store, {0: None}, lambda: owners, interval=0.1)
    assert not monitor.available and "logical" in monitor.reason
    assert monitor.host_gpus == {0}
    with monitor:
        assert monitor.running
        time.sleep(1.0)
    assert not monitor.running
    assert monitor.errors == 0, monitor.last_error

    samples = store.samples()
    runs = [s for s in samples if s.name == "exp-a"]
    totals = [s for s in samples if s.name is None]
    assert len(runs) >= 5  # ~10 readings at 0.1 s, plus the final one
    assert all(s.pid == holder.pid and s.gpu == 0 for s in runs)
    assert min(s.used_bytes for s in runs) >= 150 * MB
    # The grandchild's 40 MB counts too: the whole process group is summed.
    assert max(s.used_bytes for s in runs) >= 230 * MB
    assert {s.t for s in totals} == {s.t for s in runs}  # one GPU row per reading, same timestamp
    by_t = {s.t: s.used_bytes for s in runs}
    assert all(s.used_bytes == by_t[s.t] and s.gpu == 0 and s.total_bytes is None for s in totals)
    assert all(abs(s.t - time.time()) < 30 for s in samples)  # Unix time, not monotonic
    assert [s.t for s in samples] == sorted(s.t for s in samples)

    assert monitor.peaks() == gpu_peaks(samples) == {0: max(by_t.values())}
    assert experiment_peaks(samples) == {"exp-a": max(by_t.values())}


def test_runs_come_and_go_and_vanished_groups_read_zero(holder, store):
    live: dict[int, tuple[str, int]] = {}
    monitor = Monitor(store, {0: None, 1: None}, lambda: dict(live), interval=0.05)
    monitor.sample()  # nothing running: both GPUs read 0
    live[holder.pid] = ("exp-a", 1)
    live[2**22 + 12345] = ("ghost", 0)  # a pid no process has (above the default pid_max of 4M)
    monitor.sample()
    monitor.stop()  # never started: takes the final reading all the same
    monitor.stop()  # idempotent
    with pytest.raises(RuntimeError):
        monitor.start()

    readings: dict[float, list[Sample]] = {}
    for s in store.samples():
        readings.setdefault(s.t, []).append(s)
    first, second, final = (readings[t] for t in sorted(readings))
    assert sorted((s.gpu, s.used_bytes) for s in first) == [(0, 0), (1, 0)]
    for reading in (second, final):
        rows = {(s.gpu, s.name): s.used_bytes for s in reading}
        assert rows[(0, "ghost")] == 0 and rows[(0, None)] == 0
        assert rows[(1, "exp-a")] >= 150 * MB and rows[(1, None)] == rows[(1, "exp-a")]
    assert monitor.errors == 0


def test_owners_raising_is_recorded_not_raised(store):
    def broken() -> dict[int, tuple[str, int]]:
        raise ValueError("scheduler state is being rebuilt")

    monitor = Monitor(store, {0: None}, broken, interval=0.05)
    monitor.start()
    time.sleep(0.3)
    assert monitor.running  # the thread survives failing readings
    monitor.stop()
    assert monitor.errors >= 2
    assert monitor.last_error == "ValueError: scheduler state is being rebuilt"
    assert store.samples() == []


def test_nvml_unavailable_on_a_cpu_machine_does_not_raise(store):
    monitor = Monitor(store, {0: 0}, dict, interval=0.1)  # GPU 0 is physical device 0
    try:
        if monitor.available:
            pytest.skip("NVML initialised: this machine has an NVIDIA driver")
        assert monitor.reason and ("NVML" in monitor.reason or "nvidia-ml-py" in monitor.reason)
        assert monitor.host_gpus == {0} and monitor.nvml_gpus == frozenset()
        rows = monitor.sample()  # falls back to the host: one GPU row of 0 (nothing running)
        assert [(s.gpu, s.used_bytes, s.name) for s in rows] == [(0, 0, None)]
    finally:
        monitor.stop()

    nvml_only = Monitor(store, {0: 0}, dict, source="nvml")
    assert not nvml_only.available and nvml_only.host_gpus == frozenset()
    assert nvml_only.read() == []  # no source for GPU 0
    nvml_only.stop()


def test_nvml_on_a_gpu_machine(store):
    """Only where a driver is present: GPU rows with totals, and our own process (if on the GPU) as OTHER."""
    monitor = Monitor(store, {0: 0}, dict, interval=0.1)
    try:
        if not monitor.available:
            pytest.skip(f"no NVML here: {monitor.reason}")
        rows = monitor.sample()
        gpu_rows = [s for s in rows if s.name is None]
        assert len(gpu_rows) == 1 and gpu_rows[0].total_bytes and gpu_rows[0].total_bytes > 0
        assert all(s.name == OTHER for s in rows if s.name is not None)  # no run is live
    finally:
        monitor.stop()


def test_host_source_never_touches_nvml(store):
    monitor = Monitor(store, {0: 0, 1: None}, dict, source="host")
    assert not monitor.available and monitor.reason == "source='host' was asked for"
    assert monitor.host_gpus == {0, 1}
    monitor.stop()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"interval": 0}, "interval"), ({"source": "gpu"}, "source"), ({"gpus": {0: -1}}, "NVML index")],
)
def test_bad_arguments_are_config_errors(store, kwargs, message):
    args = {"gpus": {0: None}, "interval": 1.0, "source": "auto", **kwargs}
    with pytest.raises(ConfigError, match=message) as info:
        Monitor(store, args["gpus"], dict, interval=args["interval"], source=args["source"])
    assert "\n" not in str(info.value)


def test_peaks_from_samples():
    samples = [
        Sample(t=1.0, gpu=0, used_bytes=100),
        Sample(t=1.0, gpu=0, used_bytes=60, name="a", pid=10),
        Sample(t=1.0, gpu=0, used_bytes=30, name="a", pid=11),  # two processes of one run: summed
        Sample(t=1.0, gpu=1, used_bytes=5, name=OTHER, pid=99),
        Sample(t=2.0, gpu=0, used_bytes=250),
        Sample(t=2.0, gpu=0, used_bytes=80, name="a", pid=10),
        Sample(t=2.0, gpu=1, used_bytes=40),
        Sample(t=2.0, gpu=1, used_bytes=40, name="b", pid=12),
        Sample(t=3.0, gpu=0, used_bytes=20),
    ]
    assert gpu_peaks(samples) == {0: 250, 1: 40}
    assert experiment_peaks(samples) == {"a": 90, "b": 40, OTHER: 5}
    assert gpu_peaks([]) == {} and experiment_peaks([]) == {}


def test_group_rss_of_own_group():
    mine = os.getpgid(0)
    rss = group_rss([mine, 2**22 + 12345])
    assert rss[mine] > 10 * MB  # this interpreter (and pytest) at least
    assert rss[2**22 + 12345] == 0
    assert group_rss([]) == {}
