"""The memory monitor of ``jaxfit schedule``: what the runs side by side really take (NVML per GPU
and per process, or each run's host memory on logical GPUs), sampled to SQLite.

The design, at length: docs/guides/how-it-works.md, "The memory monitor".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from jaxfit.errors import ConfigError
from jaxfit.schedule.state import Sample, StateStore

OTHER = "<other>"
"""The ``name`` of NVML process rows that belong to no live run (experiment names never hold ``<``)."""

Source = Literal["auto", "nvml", "host"]
"""Which source samples GPUs with a physical index (see the module docstring)."""

Owners = Callable[[], Mapping[int, tuple[str, int]]]
"""Returns ``{runner pid: (experiment name, plan GPU index)}`` for the live attempts."""

_SOURCES = ("auto", "nvml", "host")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def group_rss(pgids: Iterable[int], proc: str = "/proc") -> dict[int, int]:
    """The summed resident set size, in bytes, of every process in each of the process groups ``pgids``.

    One pass over ``/proc/<pid>/stat`` (Linux only). Processes that end while they are read are
    skipped; a group with no process left maps to 0.

    Raises:
      OSError: ``proc`` cannot be listed (no ``/proc``: not Linux).
    """
    wanted = {int(p): 0 for p in pgids}
    if not wanted:
        return {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # ended between the listing and the read (ENOENT, ESRCH)
            continue
        # "pid (comm) state ppid pgrp ... rss ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            pgrp, rss_pages = int(fields[2]), int(fields[21])
        except (IndexError, ValueError):
            continue
        if pgrp in wanted:
            wanted[pgrp] += max(rss_pages, 0) * _PAGE_SIZE
    return wanted


def gpu_peaks(samples: Iterable[Sample]) -> dict[int, int]:
    """The highest measured used bytes of each GPU (its rows with ``name`` None), by plan GPU index."""
    peaks: dict[int, int] = {}
    for s in samples:
        if s.name is None and s.used_bytes > peaks.get(s.gpu, -1):
            peaks[s.gpu] = s.used_bytes
    return peaks


def experiment_peaks(samples: Iterable[Sample]) -> dict[str, int]:
    """The highest measured used bytes of each experiment (and of :data:`OTHER`).

    The rows of one experiment in one reading (several processes, or several GPUs) are summed first,
    then the largest sum over the readings is taken.
    """
    per_reading: dict[tuple[float, str], int] = {}
    for s in samples:
        if s.name is not None:
            key = (s.t, s.name)
            per_reading[key] = per_reading.get(key, 0) + s.used_bytes
    peaks: dict[str, int] = {}
    for (_, name), used in per_reading.items():
        if used > peaks.get(name, -1):
            peaks[name] = used
    return peaks


class Monitor:
    """Samples memory every ``interval`` seconds into ``store`` from a daemon thread.

    Args:
      store: The schedule's state file (written from the monitor thread; it is thread-safe).
      gpus: ``{plan GPU index: NVML physical index}``; None for a logical GPU (host fallback). The
        physical index is NVML's (``nvidia-smi``'s), not the position in ``CUDA_VISIBLE_DEVICES``.
      owners: Returns ``{runner pid: (experiment name, plan GPU index)}`` of the live attempts. It is
        called from the monitor thread, once per reading, so it must be thread-safe (a copy of a
        dict taken under a lock, say). A run on a GPU missing from ``gpus`` is sampled by the host.
      interval: Seconds between readings (> 0).
      source: ``"auto"``, ``"nvml"`` or ``"host"`` (see the module docstring).

    Raises:
      ConfigError: ``interval`` is not positive, ``source`` is unknown, or a physical index is negative.

    Use ``with Monitor(...) as m:`` or :meth:`start` then :meth:`stop`.
    """

    def __init__(
        self,
        store: StateStore,
        gpus: Mapping[int, int | None],
        owners: Owners,
        interval: float = 2.0,
        source: Source = "auto",
    ) -> None:
        if source not in _SOURCES:
            raise ConfigError(f"monitor source {source!r} is not one of {', '.join(_SOURCES)}")
        if not interval > 0:
            raise ConfigError(f"monitor interval {interval!r} must be a positive number of seconds")
        for gpu, nvml_index in gpus.items():
            if nvml_index is not None and nvml_index < 0:
                raise ConfigError(f"GPU {gpu}: NVML index {nvml_index} must be 0 or more (None for a logical GPU)")
        self.store = store
        self.gpus: dict[int, int | None] = dict(gpus)
        self.owners = owners
        self.interval = float(interval)
        self.source: Source = source
        self.errors = 0
        """How many readings (or parts of one) failed."""
        self.last_error: str | None = None
        """The latest of those failures, as ``Type: message``."""

        self._nvml: Any = None  # the pynvml module once initialised
        self._handles: dict[int, Any] = {}  # plan GPU -> NVML handle
        self._peaks: dict[int, int] = {}
        self._lock = threading.Lock()  # one reading at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._host_ok = os.path.isfile("/proc/self/stat")

        reasons: list[str] = []
        physical = {g: p for g, p in self.gpus.items() if p is not None}
        if source == "host":
            reasons.append("source='host' was asked for")
        elif not physical:
            reasons.append("no GPU has a physical index (logical GPUs)")
        else:
            failure = self._init_nvml()
            if failure is not None:
                reasons.append(failure)
            else:
                nvml: Any = self._nvml  # set by _init_nvml
                for gpu, index in sorted(physical.items()):
                    try:
                        self._handles[gpu] = nvml.nvmlDeviceGetHandleByIndex(index)
                    except nvml.NVMLError as e:
                        reasons.append(f"GPU {gpu}: NVML has no device {index} ({e})")
                if not self._handles:
                    self._shutdown_nvml()
        self.host_gpus: frozenset[int] = frozenset(
            g for g in self.gpus if g not in self._handles and (source != "nvml" or self.gpus[g] is None)
        )
        """The plan GPUs sampled by the host fallback."""
        if self.host_gpus and not self._host_ok:
            reasons.append("host fallback is off: no /proc/self/stat (Linux only)")
        self.reason: str | None = "; ".join(reasons) or None
        """Why NVML does not sample every GPU with a physical index, or why the host fallback is off
        (None when neither applies)."""

    # -- NVML ---------------------------------------------------------------------------------

    def _init_nvml(self) -> str | None:
        try:
            import pynvml
        except ImportError:
            return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            return f"NVML did not initialise: {e}"
        except OSError as e:  # a broken driver library
            return f"NVML did not load: {e}"
        self._nvml = pynvml
        return None

    def _shutdown_nvml(self) -> None:
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        self._handles = {}
        self._nvml = None

    @property
    def available(self) -> bool:
        """Whether NVML samples at least one GPU (see :attr:`reason` for those it does not)."""
        return bool(self._handles)

    @property
    def nvml_gpus(self) -> frozenset[int]:
        """The plan GPUs sampled through NVML."""
        return frozenset(self._handles)

    def _nvml_rows(self, t: float, gpu: int, handle: Any, groups: Mapping[int, str]) -> list[Sample]:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:  # not supported (MIG, some vGPUs)
            utilization = None
        rows = [
            Sample(t=t, gpu=gpu, used_bytes=int(memory.used), total_bytes=int(memory.total), utilization=utilization)
        ]
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as e:
            self._failed(e)
            processes = []
        for p in processes:
            used = p.usedGpuMemory
            if used is None:  # not available (Windows WDDM, some MIG setups)
                continue
            rows.append(
                Sample(
                    t=t,
                    gpu=gpu,
                    used_bytes=int(used),
                    total_bytes=int(memory.total),
                    name=self._owner_of(int(p.pid), groups),
                    pid=int(p.pid),
                )
            )
        return rows

    @staticmethod
    def _owner_of(pid: int, groups: Mapping[int, str]) -> str:
        if pid in groups:
            return groups[pid]
        try:
            return groups.get(os.getpgid(pid), OTHER)
        except OSError:  # ended, or not in this PID namespace (containers report host pids)
            return OTHER

    # -- readings -----------------------------------------------------------------------------

    def _failed(self, error: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(error).__name__}: {error}"

    def read(self) -> list[Sample]:
        """Take one reading now and return it, without storing it (nor counting it in :meth:`peaks`)."""
        t = time.time()
        owners = {int(pid): (str(name), int(gpu)) for pid, (name, gpu) in dict(self.owners()).items()}
        rows: list[Sample] = []
        if self._handles:
            groups = {pid: name for pid, (name, _) in owners.items()}
            for gpu, handle in sorted(self._handles.items()):
                try:
                    rows.extend(self._nvml_rows(t, gpu, handle, groups))
                except self._nvml.NVMLError as e:  # GPU lost, driver reloaded...
                    self._failed(e)
        if not self._host_ok:
            return rows
        host_runs = {
            pid: owner for pid, owner in owners.items() if owner[1] in self.host_gpus or owner[1] not in self.gpus
        }
        gpus = sorted(self.host_gpus | {gpu for _, gpu in host_runs.values()})
        rss = group_rss(host_runs)
        totals = dict.fromkeys(gpus, 0)
        per_run: list[Sample] = []
        for pid, (name, gpu) in sorted(host_runs.items(), key=lambda item: (item[1][1], item[1][0])):
            used = rss.get(pid, 0)
            totals[gpu] += used
            per_run.append(Sample(t=t, gpu=gpu, used_bytes=used, name=name, pid=pid))
        rows.extend(Sample(t=t, gpu=gpu, used_bytes=used) for gpu, used in totals.items())
        rows.extend(per_run)
        return rows

    def sample(self) -> list[Sample]:
        """Take one reading now, store it, and return it (errors are recorded, not raised)."""
        with self._lock:
            try:
                rows = self.read()
                self.store.add_samples(rows)
            except Exception as e:
                self._failed(e)
                return []
            for s in rows:
                if s.name is None and s.used_bytes > self._peaks.get(s.gpu, -1):
                    self._peaks[s.gpu] = s.used_bytes
            return rows

    def peaks(self) -> dict[int, int]:
        """The highest used bytes of each GPU in the readings this monitor stored (see :func:`gpu_peaks`
        for every sample of a state file, earlier schedulers' included)."""
        with self._lock:
            return dict(self._peaks)

    # -- thread -------------------------------------------------------------------------------

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # a slow reading: skip the missed ticks rather than bunch up
                next_at = now + self.interval
            self._stop.wait(next_at - now)

    @property
    def running(self) -> bool:
        """Whether the monitor thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Monitor:
        """Start the thread (a first reading is taken at once). Does nothing if it runs already.

        Raises:
          RuntimeError: the monitor was stopped (make a new one).
        """
        if self._stopped:
            raise RuntimeError("this Monitor was stopped; create a new one")
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="jaxfit-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread, wait for it (up to ``timeout`` seconds), take a final reading, release NVML.

        Calling it again does nothing. If the thread is stuck in a reading past ``timeout``, no final
        reading is taken and NVML is left initialised (the thread is a daemon: it ends with the process).
        """
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._failed(TimeoutError(f"the monitor thread did not stop within {timeout:g} s"))
                return
        self.sample()
        self._shutdown_nvml()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
