"""The parent's side of the compile child: start it under a fraction, ask for peaks, stop it.

See :mod:`jaxfit.fit.worker` for why compiles happen in a child process.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxfit import errors
from jaxfit._probe.jaxfit_lean import LEAN_ENV
from jaxfit.errors import WorkerError
from jaxfit.fit.budget import set_fraction
from jaxfit.fit.command import check_batch_flag, hooked_pythonpath
from jaxfit.fit.gpu_turns import GPU_TURNS
from jaxfit.fit.leftovers import probe_ended, probe_environment, probe_started
from jaxfit.fit.memory import MemoryReport, next_input_bytes
from jaxfit.fit.sources import ScriptSource, Source, to_json


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the compile child found: the device and the allocator limit under its fraction.

    ``device_count`` is every device the child sees; ``topology`` says where the devices of a
    mesh came from (:data:`jaxfit.fit.mesh.Topology`: ``mock`` programs compile but cannot run).
    """

    platform: str
    device_kind: str
    device_count: int
    bytes_limit: int | None
    limit_sensitive: bool
    host_memory_bytes: int
    jax_version: str
    topology: str = "real"
    start_peak_bytes: int | None = None
    """The most device memory the child had in use when it was ready (a script's probe: its
    start-up's peak, in a pool that grows); ``None`` where the device does not say."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceInfo:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclasses.dataclass(frozen=True)
class CompileOutcome:
    """One compile's answer.

    Attributes:
      batch_size: The batch it was compiled at.
      memory: The memory analysis (``None`` when the compile failed).
      compile_seconds: Wall time of lowering + compiling (near zero on a cache hit).
      lower_seconds: The part of it spent tracing and lowering the step (Python, one batch at a
        time: a round's batches are traced one after another, each compiled as soon as it is traced).
      cached: Whether the answer came from the compile cache.
      oom: The compile itself ran out of memory (the step does not fit).
      error: The failure message when the compile failed for another reason.
      autotuned: Whether GPU autotuning was on for this compile.
      components: The step's arguments by name, the bytes one device holds of each and their
        unsharded bytes (``((name, bytes, whole_bytes), ...)``), for the memory breakdown
        (:mod:`jaxfit.fit.breakdown`).
      start_up_oom: A script's start-up ran out of memory under this process's pool, before its
        step (its out-of-memory line): nothing was compiled (``oom`` is set too).
    """

    batch_size: int
    memory: MemoryReport | None
    compile_seconds: float
    cached: bool = False
    oom: bool = False
    error: str | None = None
    autotuned: bool = True
    lower_seconds: float = 0.0
    components: tuple[tuple[str, int, int], ...] = ()
    start_up_oom: str | None = None


@dataclasses.dataclass(frozen=True)
class Overhead:
    """Device memory a process holds outside its XLA pool (CUDA context, libraries).

    Attributes:
      bytes: The measurement, or None when it could not be made (``method`` says why).
      method: How it was measured (nvidia-smi's per-process use minus the pool), or why not.
      process_used_bytes: nvidia-smi's per-process use.
      pool_bytes: The pool's bytes at the time.
    """

    bytes: int | None
    method: str
    process_used_bytes: int | None = None
    pool_bytes: int | None = None


NO_OVERHEAD = Overhead(bytes=0, method="not a GPU")
"""What a CPU process holds outside a pool it does not have."""

DEFAULT_STEP_NAME = "train_step"
"""The train step's name when ``--step-name`` is not given (then a step-like function is found too)."""
HOOK_VARIABLES = (
    "JAXFIT_HOOK_OWNER",
    "JAXFIT_MEASURE",
    "JAXFIT_MEASURE_REPORT",
    "JAXFIT_MEASURE_GIVE_UP",
    "JAXFIT_MEASURE_PROGRAMS",
    "JAXFIT_MEASURE_DROP_MARGIN",
    "JAXFIT_MEASURE_DEADLINE",
    "JAXFIT_MEASURE_STEP_NAME",
    "JAXFIT_MEASURE_WAIT",
    "JAXFIT_MEASURE_WAIT_SECONDS",
    "JAXFIT_PIN",
    "JAXFIT_PIN_REPORT",
    "JAXFIT_PIN_STEP_NAME",
    "JAXFIT_WANDB_CONFIG",
    "JAXFIT_PROBE_STEP_NAME",
    "JAXFIT_PROBE_STEP_AUTO",
    "JAXFIT_PROBE_BATCH_SIZE",
    "JAXFIT_PROBE_BATCH_ARG",
    "JAXFIT_PROBE_WRITES",
    "JAXFIT_HELP_CHECK",
    "JAXFIT_POOL_BYTES",
)
"""Variables of the start-up hook: set only for the process they are meant for, never inherited."""


def child_environment(mem_fraction: float, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a compile child: the target fraction, preallocation off."""
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}
    set_fraction(env, f"{mem_fraction:.6g}")
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def launch_for(source: Source, python: str = sys.executable) -> tuple[list[str], dict[str, str], str | None]:
    """``(argv, extra environment, cwd)`` that start a compile server for ``source``.

    A built-in example or ``--entry`` runs in ``python -m jaxfit.fit.worker``. A training script runs
    as itself, with the probe folder first on PYTHONPATH: its ``sitecustomize`` intercepts the
    jitted step's first call and serves compiles from inside the script (see
    :mod:`jaxfit._probe.sitecustomize`), so the script's own environment needs no jaxfit. Inside a
    fit the probe also records what the script creates (:func:`jaxfit.fit.leftovers.probe_environment`).
    """
    if not isinstance(source, ScriptSource):
        return [python, "-m", "jaxfit.fit.worker"], {"JAXFIT_WORKLOAD_SOURCE": to_json(source)}, None
    extra = {
        "PYTHONPATH": hooked_pythonpath(),
        "JAXFIT_PROBE_STEP_NAME": source.step_name or DEFAULT_STEP_NAME,
        "WANDB_MODE": "disabled",  # the probe never trains, so it must not create a tracked run
        **probe_environment(),  # inside a fit: record what the script creates (jaxfit.fit.leftovers)
    }
    extra.update(source.env)  # the devices a plan's cell gives it
    if not source.step_name:
        extra["JAXFIT_PROBE_STEP_AUTO"] = "1"
    if source.batch_size:
        extra["JAXFIT_PROBE_BATCH_SIZE"] = str(source.batch_size)
    if source.batch_arg is not None:
        extra["JAXFIT_PROBE_BATCH_ARG"] = str(source.batch_arg)
    return list(source.command), extra, source.cwd


def _out_of_memory_line(log: Any) -> str:
    """The line of a probe's output that reports running out of memory (shortened)."""
    lines = [line.strip() for line in log if "RESOURCE_EXHAUSTED" in line]
    return lines[-1][:300] if lines else "RESOURCE_EXHAUSTED"


def _grown_pool_ran_out(line: str) -> bool:
    """Whether a probe's out-of-memory line (:func:`_out_of_memory_line`) is a GPU pool's (XLA's BFC
    allocator: "Out of memory while trying to allocate ... with allocator GPU_0_bfc")."""
    return "_bfc" in line and "allocate" in line


class CompileChild:
    """A compile child process under one memory fraction.

    Use as a context manager; the child is always stopped on exit, errors included.

    Args:
      source: The workload source (see :mod:`jaxfit.fit.sources`).
      mem_fraction: The XLA_PYTHON_CLIENT_MEM_FRACTION the child starts with.
      cache_path: The SQLite compile cache, or ``None`` to compile everything afresh.
      start_timeout: Seconds to wait for JAX to start and the workload to build.
      python: The interpreter to run the child with.
      preallocate: Take the whole pool at start, as a training process does (a child that will
        run what it proves: :func:`jaxfit.fit.children.shared_compile_process`); else it grows.
      on_note: Told, in a sentence, what the child does that the user waits for (a second start).
    """

    def __init__(
        self,
        source: Source,
        mem_fraction: float,
        *,
        cache_path: str | None = None,
        start_timeout: float = 900.0,
        python: str = sys.executable,
        preallocate: bool = False,
        extra_env: Mapping[str, str] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.extra_env = dict(extra_env or {})
        self.on_note = on_note
        self.source = source
        self.preallocate = preallocate
        self.probing = isinstance(source, ScriptSource)
        self.mem_fraction = mem_fraction
        self.cache_path = cache_path
        self.start_timeout = start_timeout
        self.python = python
        self.info: DeviceInfo | None = None
        self.workload_info: dict[str, Any] = {}
        self.manifest: dict[str, Any] | None = None  # what a probed script ran (jaxfit_manifest)
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: Any = None
        self.jitted_names: list[str] = []
        self.called: dict[str, int] = {}  # jitted function -> calls seen (a probed script)
        self.called_kinds: dict[str, str] = {}  # jitted function -> what it does (train step, evaluation...)
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._log: collections.deque[str] = collections.deque(maxlen=60)
        self._next_id = 0
        self._recording: Any = None  # the record of what this probe creates (jaxfit.fit.leftovers)
        self.restarted_preallocated: str | None = None  # why the start-up was run again preallocated
        self.start_out_of_memory: str | None = None  # the start-up's out-of-memory line, when it did not start
        self._log_reader: threading.Thread | None = None
        self.lean_calls: dict[str, int] = {}  # jitted function -> bytes of outputs a lean start-up left out

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> CompileChild:
        if self._proc is None:  # (a child started already, to see whether it starts, is not started again)
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Interrupted (Ctrl-C, or SIGTERM turned into one): stop it now, not after a polite wait.
        self.close(polite=exc_type is None or issubclass(exc_type, Exception))

    def start(self) -> DeviceInfo:
        """Start the child and wait until it has built the workload (or reached the step).

        A lean start-up (:mod:`jaxfit._probe.jaxfit_lean`, a script's probe for a GPU that is not
        here) that fails after it left a call's outputs out is started once more in full: the
        script computed with its state before its first step.
        """
        try:
            return self._start_with_pool()
        except (WorkerError, errors.WorkloadError) as e:
            if not self.lean_calls or self.extra_env.get(LEAN_ENV) != "1" or str(e).startswith("timed out"):
                raise
            said = [line.strip() for line in self._log if line.strip()]
            why = said[-1] if said else errors.first_line(e)
        if self.on_note is not None:
            self.on_note(
                f"the script stopped before its step after a lean start-up (the outputs of "
                f"{', '.join(sorted(self.lean_calls))} traced, not computed): {why[:200]}; starting it "
                "again with its start-up run in full"
            )
        self.close(polite=False)
        self._reset_for_restart()
        self.lean_calls = {}
        self.extra_env.pop(LEAN_ENV, None)
        return self._start_with_pool()

    def _start_with_pool(self) -> DeviceInfo:
        """Start the child and wait until it has built the workload (or reached the step).

        A script whose start-up runs out of a GPU pool that grows is started once more with the
        whole pool preallocated, as a training run takes it (XLA's default) before it is said not
        to start: a pool that grows is a set of regions, and one large buffer of the start-up
        cannot span two. On an H100 under a 24 GiB card's limit (21.60 GiB), openpi's
        ``pi0_libero_low_mem_finetune`` init ran out of memory allocating 7.98 GiB in a growing
        pool and finished, at a peak of 18.52 GiB, in a preallocated one
        (``benchmarks/results/h100/init-24gib/``)."""
        try:
            return self._start_once()
        except errors.DoesNotFitError:
            grown = _out_of_memory_line(self._log)
            if not self.probing or self.preallocate or not _grown_pool_ran_out(grown):
                self.start_out_of_memory = grown
                raise
        if self.on_note is not None:
            self.on_note(
                f"the script's start-up ran out of memory in a pool that grows ({grown[:120]}); starting it again "
                "with the pool preallocated, as a training run takes it"
            )
        self._reset_for_restart()
        self.preallocate = True
        self.restarted_preallocated = grown
        try:
            return self._start_once()
        except errors.DoesNotFitError as e:
            self.start_out_of_memory = _out_of_memory_line(self._log)
            raise errors.DoesNotFitError(
                f"{e.what}; started again with the pool preallocated (as a training run takes it) after it "
                f"ran out of a pool that grows ({grown}), it ran out again",
                e.hint,
            ) from None

    @property
    def restart_note(self) -> str:
        """For the answer's message: that the start-up only ran preallocated, so the run must keep
        preallocation on ('' when it started the first time)."""
        if not self.restarted_preallocated:
            return ""
        return (
            f"its start-up ran out of memory in a pool that grows ({self.restarted_preallocated}) and started "
            "with the pool preallocated, as a training run takes it: keep XLA_PYTHON_CLIENT_PREALLOCATE unset "
            "(or true) in the run"
        )

    def _reset_for_restart(self) -> None:
        """Forget what the last start of this child saw, to start it again."""
        self.info = None
        self.workload_info, self.manifest = {}, None
        self.jitted_names, self.called, self.called_kinds = [], {}, {}
        self._replies = queue.Queue()  # new ones: the last start's readers may still be writing to theirs
        self._log = collections.deque(maxlen=60)

    def _start_once(self) -> DeviceInfo:
        if isinstance(self.source, ScriptSource):  # the answer's command must be one the script takes
            check_batch_flag(list(self.source.run_command), self.source.batch_flag)
        else:  # the child runs in jaxfit's own environment: its jax must have the platform asked for
            from jaxfit.fit.devices import check_platforms

            check_platforms()
        argv, extra, cwd = launch_for(self.source, self.python)
        reply_r, reply_w = os.pipe()
        request_r, request_w = os.pipe()
        log_r, log_w = os.pipe()
        extra = dict(extra, **self.extra_env, JAXFIT_REPLY_FD=str(reply_w), JAXFIT_REQUEST_FD=str(request_r))
        if self.cache_path:
            extra["JAXFIT_COMPILE_CACHE"] = self.cache_path
        if self.preallocate:
            extra["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_w,
                stderr=log_w,
                pass_fds=(reply_w, request_r),
                env=child_environment(self.mem_fraction, extra),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as e:
            for fd in (reply_r, reply_w, request_r, request_w, log_r, log_w):
                os.close(fd)
            raise errors.ConfigError(f"cannot start {argv[0]!r}: {e.strerror}; check the command") from None
        finally:
            if self._proc is not None:
                self._recording = probe_started(extra)
                for fd in (reply_w, request_r, log_w):
                    os.close(fd)
        try:  # from here on the child (a probed script, its workers) is stopped on any way out
            self._requests = os.fdopen(request_w, "w", buffering=1)
            # each start's readers fill that start's queue and log (a restart makes new ones)
            threading.Thread(target=self._read_replies, args=(reply_r, self._replies, self._log), daemon=True).start()
            self._log_reader = threading.Thread(target=self._read_log, args=(log_r, self._log), daemon=True)
            self._log_reader.start()
            ready = self._receive(self.start_timeout, self._start_doing(), polite=False)
            if ready.get("op") == "error":
                self._refuse_platform_that_failed(ready)
                self._raise_reported(ready, "the compile child failed to start: ")
            self.info = DeviceInfo.from_dict(ready["info"])
            self.workload_info = ready["info"].get("workload", {})
        except BaseException:
            self.close(polite=False)  # still starting: it would not read a quit request
            raise
        description = self.workload_info.get("description")
        if isinstance(description, dict):  # kept apart: it is the cache's, too large for the result
            self.manifest = description.pop("manifest", None)
        return self.info

    @property
    def running(self) -> bool:
        """Whether the child was started and has not stopped."""
        return self._proc is not None and self._proc.poll() is None

    def load(self, source: Source) -> DeviceInfo:
        """Serve ``source`` from now on, in the same process (a built-in example or ``--entry``
        workload of the same mesh: ``jaxfit tune``'s settings and accumulation proofs), without a
        new start. Raises what :meth:`start` raises, and stops the child then."""
        if self.probing or isinstance(source, ScriptSource) or self.info is None:
            raise ValueError("only a started compile child of a built-in example or --entry can load another")
        self._send({"op": "load", "source": to_json(source)})
        while True:
            reply = self._receive(self.start_timeout, "build the next workload")
            if reply.get("op") == "error":
                self._raise_reported(reply, "the compile child failed to load a workload: ")
            if reply.get("op") == "ready":
                break
        self.source = source
        self.workload_info = reply["info"].get("workload", {})
        return self.info

    def retarget(self, target: Mapping[str, Any]) -> DeviceInfo:
        """Compile for another GPU that is not here from now on (``{"name", "spec", "limit"}``), in
        the same process: a script's probe serves every card and memory size of a plan or an
        estimate from one start-up. Raises what :meth:`start` raises, and stops the child then."""
        if self.info is None or self.info.topology != "target":
            raise ValueError("only a started compile child of a GPU that is not here can compile for another")
        self._send({"op": "retarget", "target": dict(target)})
        while True:
            reply = self._receive(self.start_timeout, f"compile for {target.get('name')}")
            if reply.get("op") == "error":
                self._raise_reported(reply, "the compile child failed to switch cards: ")
            if reply.get("op") == "ready":
                break
        self.info = DeviceInfo.from_dict(reply["info"])
        return self.info

    def _refuse_platform_that_failed(self, reply: Mapping[str, Any]) -> None:
        """A ``JAX_PLATFORMS`` platform whose plugin is installed but cannot start here (a CUDA
        plugin on a machine without a GPU or cuDNN: jax fails with an empty ``AssertionError``),
        as one line with jax's own reason from the child's log."""
        spelled = os.environ.get("JAX_PLATFORMS", "")
        if (
            isinstance(self.source, ScriptSource)
            or not spelled
            or not str(reply.get("message", "")).startswith("AssertionError")
        ):
            return
        self.close(polite=False)
        reasons = [line.strip() for line in self._log if line.startswith(("RuntimeError:", "Jax plugin"))]
        reason = f" ({reasons[-1]})" if reasons else ""
        raise errors.ConfigError(
            f"JAX_PLATFORMS={spelled} asks for a platform jax cannot start here{reason}; unset JAX_PLATFORMS "
            "(or set it to cpu) to compile on the CPU, or --gpu MODEL for a GPU that is not here"
        )

    def _raise_reported(self, reply: Mapping[str, Any], internal_prefix: str = "the compile child failed: ") -> None:
        """Stop the child and raise the error it reported (a user error as its own class)."""
        self.close()
        message = str(reply.get("message", "unknown error"))
        if reply.get("kind") == "user":
            error_class = getattr(errors, str(reply.get("error_class")), None)
            if not (isinstance(error_class, type) and issubclass(error_class, errors.JaxfitError)):
                error_class = errors.WorkloadError
            raise error_class(message)
        raise WorkerError(internal_prefix + message)

    def close(self, polite: bool = True) -> None:
        """Stop the child and its whole process group: ``polite``, asked to quit first (10 s), else
        killed at once (interrupted, or still starting)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if polite:  # (not polite: killed at once, not after waiting 10 s for a quit never asked)
                if proc.poll() is None and self._requests is not None:
                    self._requests.write('{"op": "quit"}\n')
                    self._requests.flush()
                proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        finally:
            try:  # the whole session, also once the probe itself exited: a script's workers too
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                if proc.poll() is None:
                    proc.kill()
            proc.wait()
            recording, self._recording = self._recording, None
            probe_ended(recording)  # alone, the probe's writes are taken away now
            if self._requests is not None:
                try:
                    self._requests.close()
                except OSError:
                    pass
                self._requests = None

    # -- I/O ------------------------------------------------------------------------------
    @staticmethod
    def _read_replies(fd: int, replies: queue.Queue[dict[str, Any] | None], log: collections.deque[str]) -> None:
        with os.fdopen(fd, "r") as f:
            for line in f:
                try:
                    replies.put(json.loads(line))
                except json.JSONDecodeError:
                    log.append(f"(bad reply) {line.rstrip()}")
        replies.put(None)

    @staticmethod
    def _read_log(fd: int, log: collections.deque[str]) -> None:
        with os.fdopen(fd, "r", errors="replace") as f:
            for line in f:
                log.append(line.rstrip())

    def log_tail(self, lines: int = 12) -> str:
        """The last lines the child printed (its stderr and stdout); when none of them says what went
        wrong, the last line that does (an ``error`` line) comes first."""
        log = list(self._log)
        tail = log[-lines:]
        if not any("error" in line.lower() for line in tail):
            earlier = [line for line in log[:-lines] if "error" in line.lower()]
            if earlier:
                tail = [earlier[-1], "..."] + tail
        return "\n".join(tail)

    def _receive(self, timeout: float, doing: str, polite: bool = True) -> dict[str, Any]:
        """The child's next reply within ``timeout`` seconds; on none, the child is stopped
        (:meth:`close`, ``polite`` or not: a child still starting would not read a quit request)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._replies.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    self.close(polite=polite)
                    if not self.probing:
                        hint = ""
                    elif not self.jitted_names:  # still starting up (importing, loading data): no jit yet
                        hint = (
                            f"; nothing was jitted yet, so the script was still starting up: raise --probe-timeout "
                            f"(now {timeout:.0f} s) for a start-up that takes longer"
                        )
                    else:
                        hint = "; pass --step-name with the name of your jitted train step"
                    raise WorkerError(
                        f"timed out after {timeout:.0f} s waiting to {doing}{self._seen_note()}{hint}"
                    ) from None
                continue
            if reply is None:
                code = self._proc.wait() if self._proc else None
                if self._log_reader is not None:  # its last lines (the error) may still be in the pipe
                    self._log_reader.join(timeout=5)
                tail = self.log_tail()
                who = "the script" if self.probing else "the compile child"
                if self.probing and "RESOURCE_EXHAUSTED" in "\n".join(self._log):
                    self.close()
                    raise errors.DoesNotFitError(
                        f"the script ran out of memory (RESOURCE_EXHAUSTED) before it called its train step, under "
                        f"fraction {self.mem_fraction:g} of this device{self._seen_note(exited_cleanly=False)}: "
                        f"what its start-up builds (the train state, its initialisation) does not fit, whatever the "
                        f"batch; its last line: {_out_of_memory_line(self._log)}",
                        "raise --mem-fraction, plan for a larger card, or shrink what the script builds (LoRA, "
                        "bfloat16 weights, FSDP over more devices)",
                    )
                raise WorkerError(
                    f"{who} exited (code {code}) while trying to {doing}{self._seen_note(exited_cleanly=code == 0)}"
                    + (f"; its last output:\n{tail}" if tail else "")
                )
            if reply.get("op") == "jit_seen":
                self.jitted_names.append(str(reply.get("name")))
                continue
            if reply.get("op") == "lean":  # a call of the start-up left out (jaxfit_lean)
                name = str(reply.get("name"))
                self.lean_calls[name] = self.lean_calls.get(name, 0) + int(reply.get("bytes") or 0)
                continue
            if reply.get("op") == "jit_called":
                self.called[str(reply.get("name"))] = int(reply.get("count") or 1)
                if reply.get("kind"):
                    self.called_kinds[str(reply.get("name"))] = str(reply["kind"])
                continue
            return reply

    def _send(self, message: dict[str, Any]) -> None:
        assert self._requests is not None, "child not started"
        self._requests.write(json.dumps(message) + "\n")
        self._requests.flush()

    def _seen_note(self, exited_cleanly: bool = True) -> str:
        """What the probed script jitted and called: the functions it called first (with how often),
        then those it only jitted; when it ended by itself (or ran on), whether none was a train step."""
        if not self.probing:
            return ""
        if not self.jitted_names:
            return " (it jitted no function before that)"
        called = sorted(self.called.items(), key=lambda kv: -kv[1])
        only_jitted = [n for n in self.jitted_names if n not in self.called]
        parts = []
        if called:
            parts.append(
                "jitted functions it called (times, at least; what they do): "
                + ", ".join(
                    f"{name} ({count}{', ' + self.called_kinds[name] if name in self.called_kinds else ''})"
                    for name, count in called[:12]
                )
            )
            if exited_cleanly and not any(kind == "train step" for kind in self.called_kinds.values()):
                parts.append(
                    "none of them updates the state it is given, as a train step does (it returns the state "
                    "updated); a script that only evaluates has no train step to fit"
                )
        if only_jitted:
            more = f" and {len(only_jitted) - 12} more" if len(only_jitted) > 12 else ""
            parts.append("jitted but not called: " + ", ".join(only_jitted[:12]) + more)
        return f" ({'; '.join(parts)})"

    def _start_doing(self) -> str:
        if isinstance(self.source, ScriptSource):
            name = self.source.step_name
            if name:
                return f"reach the first call of the jitted function {name!r} in the script"
            return (
                "reach the first call of the script's train step (train_step, or the first jitted function that "
                "returns the state it is given updated)"
            )
        return "start the compile child"

    # -- requests -------------------------------------------------------------------------
    def compile(
        self,
        batches: list[int],
        *,
        autotune: bool = True,
        threads: int | None = None,
        timeout: float = 3600.0,
        on_result: Callable[[CompileOutcome], None] | None = None,
        keep_untuned: bool = False,
    ) -> dict[int, CompileOutcome]:
        """Compile at each batch size (concurrently, in threads of the child).

        Args:
          batches: Batch sizes.
          autotune: GPU autotuning on (slower, the real program) or off (peaks within 0.03 %).
          threads: Concurrent compiles (default: all at once).
          keep_untuned: On a GPU, untuned compiles are made even when cached and their programs
            kept in the child, to be timed (:meth:`time` with ``untuned``).
          timeout: Seconds for the whole request.
          on_result: Called as each compile finishes (for progress displays).

        Autotuned compiles on a GPU take their turn (:data:`jaxfit.fit.gpu_turns.GPU_TURNS`): none
        runs while another child of this process times a program.
        """
        tuned = autotune and bool(self.info is not None and self.info.limit_sensitive)
        with GPU_TURNS.autotuning() if tuned else contextlib.nullcontext():
            return self._compile(batches, autotune, threads, timeout, on_result, keep_untuned)

    def _compile(
        self,
        batches: list[int],
        autotune: bool,
        threads: int | None,
        timeout: float,
        on_result: Callable[[CompileOutcome], None] | None,
        keep_untuned: bool,
    ) -> dict[int, CompileOutcome]:
        self._next_id += 1
        request_id = self._next_id
        self._send(
            {
                "op": "compile",
                "id": request_id,
                "batches": batches,
                "autotune": autotune,
                "threads": threads or len(batches),
                "keep_untuned": keep_untuned,
            }
        )
        results: dict[int, CompileOutcome] = {}
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(max(1.0, deadline - time.monotonic()), f"compile batch sizes {batches}")
            if reply.get("op") == "done" and reply.get("id") == request_id:
                return results
            if reply.get("op") == "error":
                self._raise_reported(reply)
            if reply.get("op") != "result":
                continue
            memory = MemoryReport.from_dict(reply["memory"]) if reply.get("ok") else None
            if memory is not None and self.info is not None and self.info.limit_sensitive:
                # a GPU's pool also holds the loop's next batch while the step runs
                memory = dataclasses.replace(memory, next_input_bytes=next_input_bytes(memory))
            outcome = CompileOutcome(
                batch_size=int(reply["batch"]),
                memory=memory,
                compile_seconds=float(reply["compile_s"]),
                lower_seconds=float(reply.get("lower_s") or 0.0),
                cached=bool(reply.get("cached")),
                oom=bool(reply.get("oom")),
                error=None if reply.get("ok") else reply.get("error"),
                autotuned=autotune and bool(self.info is not None and self.info.limit_sensitive),
                components=tuple(
                    (str(c[0]), int(c[1]), int(c[2] if len(c) > 2 else c[1])) for c in reply.get("components") or ()
                ),
            )
            results[outcome.batch_size] = outcome
            if on_result:
                on_result(outcome)

    def pin(self, batch: int, path: str, timeout: float = 3600.0) -> dict[str, Any]:
        """Write the program that was compiled at ``batch`` (as training compiles it) to ``path``.

        Returns the child's answer: ``ok``, ``fingerprint``, ``memory`` of the program written,
        ``recompiled`` (it had to be compiled again), ``xla_flags``, or ``error``.
        """
        self._send({"op": "pin", "batch": batch, "path": path})
        while True:
            reply = self._receive(timeout, f"write the program of batch {batch}")
            if reply.get("op") == "pinned":
                return reply

    def time(
        self,
        batch: int,
        warmup: int,
        steps: int,
        give_up: tuple[int, float] | None = None,
        timeout: float = 3600.0,
        untuned: bool = False,
    ) -> dict[str, Any]:
        """Run the program compiled at ``batch`` (as training compiles it) in the child on real
        arguments: ``warmup`` calls, then ``steps`` timed ones; with ``give_up = (look, seconds per
        sample)``, only ``look`` timed ones when they took longer than that a sample on average;
        ``untuned``: the untuned program a compile with ``keep_untuned`` left (an error when there
        is none). Returns the child's answer: ``ok``, ``step_seconds``, ``first_call_seconds``,
        ``stopped_early``, or ``error`` (and ``oom``)."""
        request: dict[str, Any] = {"op": "time", "batch": batch, "warmup": warmup, "steps": steps}
        if untuned:
            request["untuned"] = True
        if give_up is not None:
            request["give_up"] = list(give_up)
        with GPU_TURNS.timing():  # alone: no other child of this process autotunes or times meanwhile
            self._send(request)
            while True:
                reply = self._receive(timeout, f"time the program of batch {batch}")
                if reply.get("op") == "timed":
                    return reply

    def process_overhead(self) -> Overhead:
        """Measure the device memory the child holds outside the XLA pool (GPU only)."""
        self._send({"op": "overhead"})
        while True:
            reply = self._receive(120, "measure the per-process overhead")
            if reply.get("op") == "overhead":
                return Overhead(
                    bytes=reply.get("bytes"),
                    method=str(reply.get("method")),
                    process_used_bytes=reply.get("process_used_bytes"),
                    pool_bytes=reply.get("pool_bytes"),
                )
