"""The parent's side of the compile child: start it under a fraction, ask for peaks, stop it.

See :mod:`jaxfit.worker` for why compiles happen in a child process.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxfit import errors
from jaxfit.errors import WorkerError
from jaxfit.memory import MemoryReport


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the compile child found: the device and the allocator limit under its fraction."""

    platform: str
    device_kind: str
    device_count: int
    bytes_limit: int | None
    limit_sensitive: bool
    host_memory_bytes: int
    jax_version: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceInfo:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class CompileOutcome:
    """One compile's answer.

    Attributes:
      batch_size: The batch it was compiled at.
      memory: The memory analysis (``None`` when the compile failed).
      compile_seconds: Wall time of lowering + compiling (near zero on a cache hit).
      cached: Whether the answer came from the compile cache.
      oom: The compile itself ran out of memory (the step does not fit).
      error: The failure message when the compile failed for another reason.
      autotuned: Whether GPU autotuning was on for this compile.
    """

    batch_size: int
    memory: MemoryReport | None
    compile_seconds: float
    cached: bool = False
    oom: bool = False
    error: str | None = None
    autotuned: bool = True


def child_environment(mem_fraction: float, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a compile child: the target fraction, preallocation off."""
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{mem_fraction:.6g}"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class CompileChild:
    """A compile child process under one memory fraction.

    Use as a context manager; the child is always stopped on exit, errors included.

    Args:
      source: The workload source (see :mod:`jaxfit.sources`).
      mem_fraction: The XLA_PYTHON_CLIENT_MEM_FRACTION the child starts with.
      cache_path: The SQLite compile cache, or ``None`` to compile everything afresh.
      start_timeout: Seconds to wait for JAX to start and the workload to build.
      python: The interpreter to run the child with.
    """

    def __init__(
        self,
        source: Mapping[str, Any],
        mem_fraction: float,
        *,
        cache_path: str | None = None,
        start_timeout: float = 900.0,
        python: str = sys.executable,
    ) -> None:
        self.source = dict(source)
        self.mem_fraction = mem_fraction
        self.cache_path = cache_path
        self.start_timeout = start_timeout
        self.python = python
        self.info: DeviceInfo | None = None
        self.workload_info: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._log: collections.deque[str] = collections.deque(maxlen=60)
        self._next_id = 0

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> CompileChild:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> DeviceInfo:
        """Start the child and wait until it has built the workload."""
        reply_r, reply_w = os.pipe()
        log_r, log_w = os.pipe()
        spec = {"source": self.source, "cache_path": self.cache_path}
        try:
            self._proc = subprocess.Popen(
                [self.python, "-m", "jaxfit.worker", "--spec", json.dumps(spec), "--reply-fd", str(reply_w)],
                stdin=subprocess.PIPE, stdout=log_w, stderr=log_w, pass_fds=(reply_w,),
                env=child_environment(self.mem_fraction),
            )
        finally:
            os.close(reply_w)
            os.close(log_w)
        threading.Thread(target=self._read_replies, args=(reply_r,), daemon=True).start()
        threading.Thread(target=self._read_log, args=(log_r,), daemon=True).start()
        ready = self._receive(self.start_timeout, "start the compile child")
        if ready.get("op") == "error":
            self.close()
            message = ready.get("message", "unknown error")
            if ready.get("kind") == "user":
                error_class = getattr(errors, str(ready.get("error_class")), None)
                if not (isinstance(error_class, type) and issubclass(error_class, errors.JaxfitError)):
                    error_class = errors.WorkloadError
                raise error_class(message)
            raise WorkerError(f"the compile child failed to start: {message}")
        self.info = DeviceInfo.from_dict(ready["info"])
        self.workload_info = ready["info"].get("workload", {})
        return self.info

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin:
                proc.stdin.write(b'{"op": "quit"}\n')
                proc.stdin.flush()
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    # -- I/O ------------------------------------------------------------------------------
    def _read_replies(self, fd: int) -> None:
        with os.fdopen(fd, "r") as f:
            for line in f:
                try:
                    self._replies.put(json.loads(line))
                except json.JSONDecodeError:
                    self._log.append(f"(bad reply) {line.rstrip()}")
        self._replies.put(None)

    def _read_log(self, fd: int) -> None:
        with os.fdopen(fd, "r", errors="replace") as f:
            for line in f:
                self._log.append(line.rstrip())

    def log_tail(self, lines: int = 12) -> str:
        """The last lines the child printed (its stderr and stdout)."""
        return "\n".join(list(self._log)[-lines:])

    def _receive(self, timeout: float, doing: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._replies.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    self.close()
                    raise WorkerError(f"timed out after {timeout:.0f} s waiting to {doing}") from None
                continue
            if reply is None:
                code = self._proc.wait() if self._proc else None
                tail = self.log_tail()
                raise WorkerError(
                    f"the compile child exited (code {code}) while trying to {doing}"
                    + (f"; its last output:\n{tail}" if tail else "")
                )
            return reply

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None, "child not started"
        self._proc.stdin.write((json.dumps(message) + "\n").encode())
        self._proc.stdin.flush()

    # -- requests -------------------------------------------------------------------------
    def compile(
        self,
        batches: list[int],
        *,
        autotune: bool = True,
        threads: int | None = None,
        timeout: float = 3600.0,
        on_result: Callable[[CompileOutcome], None] | None = None,
    ) -> dict[int, CompileOutcome]:
        """Compile at each batch size (concurrently, in threads of the child).

        Args:
          batches: Batch sizes.
          autotune: GPU autotuning on (slower, the real program) or off (peaks within 0.03 %).
          threads: Concurrent compiles (default: all at once).
          timeout: Seconds for the whole request.
          on_result: Called as each compile finishes (for progress displays).
        """
        self._next_id += 1
        request_id = self._next_id
        self._send({"op": "compile", "id": request_id, "batches": batches,
                    "autotune": autotune, "threads": threads or len(batches)})
        results: dict[int, CompileOutcome] = {}
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(max(1.0, deadline - time.monotonic()), f"compile batch sizes {batches}")
            if reply.get("op") == "done" and reply.get("id") == request_id:
                return results
            if reply.get("op") != "result":
                continue
            memory = MemoryReport.from_dict(reply["memory"]) if reply.get("ok") else None
            outcome = CompileOutcome(
                batch_size=int(reply["batch"]), memory=memory, compile_seconds=float(reply["compile_s"]),
                cached=bool(reply.get("cached")), oom=bool(reply.get("oom")),
                error=None if reply.get("ok") else reply.get("error"), autotuned=autotune,
            )
            results[outcome.batch_size] = outcome
            if on_result:
                on_result(outcome)

    def process_overhead(self) -> dict[str, Any]:
        """Measure the device memory the child holds outside the XLA pool (GPU only)."""
        self._send({"op": "overhead"})
        while True:
            reply = self._receive(120, "measure the per-process overhead")
            if reply.get("op") == "overhead":
                return reply
