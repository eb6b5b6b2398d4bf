"""The Ray backend of ``jaxfit schedule``: each attempt a Ray task asking ``num_gpus`` = its share
of a GPU, run under a guard and the runner so that nothing outlives its task.

The design, at length: docs/guides/how-it-works.md, "The Ray backend".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxfit._probe import jaxfit_trust as trust
from jaxfit.errors import ConfigError
from jaxfit.schedule.backends.local import (
    DEFAULT_GRACE_SECONDS,
    LOST_WITH_NODE,
    RUNNER,
    LaunchSpec,
    _is_runner,
    _signal_group,
    read_status,
)

GRACE_S = DEFAULT_GRACE_SECONDS
"""Seconds a terminated attempt gets between SIGTERM and SIGKILL of its process group."""

TASK_NUM_CPUS = 0
"""CPUs each attempt's task reserves: none, so only GPU shares limit how many run at once."""

RAY_LOST = LOST_WITH_NODE
"""The exit code of an attempt whose Ray task was lost (its worker or node died, or it was
cancelled) before the runner recorded one."""

CLUSTER_REFRESH_S = 5.0
"""Seconds between two readings of the cluster's GPUs (:meth:`RayLauncher.cluster_gpus`)."""

RAY_TASK_ERROR = -1002
"""The exit code of an attempt whose Ray task itself raised (a bug or a broken node environment,
not a lost machine): counted as a crash."""

_RESOURCE_SCALE = 10_000
"""Ray counts fractional resources in steps of 1/10000."""

_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
"""Ray starts its workers at nice 15, which the commands would inherit: ours run at nice 0."""

_MISSING_RAY = "the ray backend needs ray: pip install 'jaxfit[ray]'"

TRAVEL_INPUTS = ("JAXFIT_PIN", "JAXFIT_WANDB_CONFIG")
"""Variables naming files an attempt reads (the pin: its whole folder, with the executable; the
run's settings for wandb): on a Ray node other than the scheduler's, copies travel with it."""
TRAVEL_OUTPUTS = ("JAXFIT_PIN_REPORT",)
"""Variables naming files an attempt writes: from another node, they come back with its result."""
LOG_RETURN_BYTES = 64 << 20
"""The most of an attempt's log that comes back from another node (its end)."""
WRONG_GPU = 78
"""The exit code of an attempt that was not started because the GPU Ray gave it is not of the size
the plan's fraction is a share of (more than :data:`GPU_SIZE_TOLERANCE` apart)."""
GPU_SIZE_TOLERANCE = 0.02
"""nvidia-smi's total and CUDA's differ by about 0.6 % on an H100; GPUs of other models by far more."""


def _import_ray() -> Any:
    """The ``ray`` module, imported on first use; ConfigError when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(_MISSING_RAY) from None
    return ray


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A one-line ConfigError when nothing answers at a cluster address of the form ``host:port``
    or ``ray://host:port`` (Ray itself retries an unreachable address for minutes). ``auto`` and
    other forms are left to Ray."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except OSError as e:
        why = e.strerror or type(e).__name__
    raise ConfigError(
        f"cannot connect to the Ray cluster at {address!r}: nothing answers there ({why}); start it with "
        "`ray start --head` or give the address `ray start --head` printed"
    )


def _first_line(error: BaseException | str) -> str:
    """An error's first non-empty line (Ray's errors carry pages of context)."""
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()[:300]
    return error if isinstance(error, str) else type(error).__name__


def _pid_path(status_path: str) -> str:
    return status_path + ".pid"


def ray_gpu_request(share: float) -> float:
    """The ``num_gpus`` a Ray task asks for a run charged ``share`` of one GPU.

    Rounded down to Ray's precision (1e-4, never below it for a positive share) so that shares
    summing to at most 1 still fit one GPU; ConfigError when ``share`` is not within [0, 1].
    """
    if not math.isfinite(share) or share < 0 or share > 1 + 1e-9:
        raise ConfigError(f"a run's GPU share must be between 0 and 1, got {share!r}")
    if share == 0:
        return 0.0
    steps = math.floor(min(share, 1.0) * _RESOURCE_SCALE + 1e-6)
    return max(steps, 1) / _RESOURCE_SCALE


GUARD = str(Path(__file__).resolve().parents[2] / "_probe" / "jaxfit_ray_guard.py")
"""The guard of an attempt (:mod:`jaxfit._probe.jaxfit_ray_guard`), shipped to workers as source."""


def _luggage(spec: LaunchSpec, node: str) -> dict[str, Any]:
    """What travels with an attempt in case Ray runs it on a node other than the scheduler's
    (``node``): no disk is assumed shared. The files its :data:`TRAVEL_INPUTS` name (for a pin, its
    whole folder), jaxfit's start-up hook (the probe folder, when on its PYTHONPATH), and the
    names of what it writes; the task uses them only on another node."""
    from jaxfit.fit.command import PROBE_DIR

    files: dict[str, bytes] = {}
    inputs: dict[str, str] = {}
    for var in TRAVEL_INPUTS:
        path = spec.env.get(var)
        if not path or not os.path.isfile(path):
            continue
        if var == "JAXFIT_PIN":  # pin.json names its executable relative to its folder
            for f in sorted(Path(path).parent.iterdir()):
                if f.is_file():
                    files[f"pin/{f.name}"] = f.read_bytes()
            inputs[var] = f"pin/{Path(path).name}"
            key = spec.env.get(trust.KEY_ENV) or trust.signing_key_path(path) or trust.key_path()
            if os.path.isfile(key):  # the node checks the pin's signature with the user's own key
                files["key/pin-key"] = Path(key).read_bytes()
                inputs[trust.KEY_ENV] = "key/pin-key"
        else:
            inputs[var] = f"in/{var}/{Path(path).name}"
            files[inputs[var]] = Path(path).read_bytes()
    if PROBE_DIR in spec.env.get("PYTHONPATH", "").split(os.pathsep):
        for f in sorted(Path(PROBE_DIR).glob("*.py")):
            files[f"probe/{f.name}"] = f.read_bytes()
    return {
        "node": node,
        "files": files,
        "inputs": inputs,
        "outputs": [v for v in TRAVEL_OUTPUTS if spec.env.get(v)],
        "probe_dir": PROBE_DIR,
        "log_bytes": LOG_RETURN_BYTES,
    }


def _land(result: Mapping[str, Any], log_path: str, status_path: str, outputs: Mapping[str, str]) -> None:
    """Keep what an attempt on another node brought back where a local attempt writes it: its log
    (appended, as attempts' logs are), its status file, the files of its :data:`TRAVEL_OUTPUTS`."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as f:
        f.write(result.get("log") or b"")
        f.write(f"jaxfit: (this attempt ran on Ray node {result.get('node')} on {result.get('host')})\n".encode())
    writes = [(status_path, result.get("status"))]
    writes += [(outputs[var], data) for var, data in (result.get("outputs") or {}).items() if var in outputs]
    for path, data in writes:
        if data is not None:
            tmp = f"{path}.{os.getpid()}.tmp"
            Path(tmp).write_bytes(data)
            os.replace(tmp, path)


def _make_task_function() -> Callable[..., int | dict[str, Any]]:
    """The body of an attempt's Ray task.

    Defined inside this factory so that cloudpickle ships it by value: its code uses only the
    standard library and ``ray``, so Ray's workers never import jaxfit.
    """

    def jaxfit_attempt(
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: str,
        status_path: str,
        cwd: str,
        runner: str,
        runner_source: str,
        guard: str,
        grace_s: float,
        keep_omp: bool,
        luggage: Mapping[str, Any] | None = None,
        planned_gpu_bytes: int | None = None,
        report_to: Sequence[str] | None = None,
    ) -> int | dict[str, Any]:
        """Run one attempt under the guard and the runner in a Ray worker; its exit code. On a node
        other than the scheduler's (``luggage``, from :func:`_luggage`), in a folder of its own with
        the files that travelled, and the result is ``{"code", "log", "status", "outputs"}``."""
        import json
        import os
        import select
        import shutil
        import signal
        import socket
        import subprocess
        import sys
        import tempfile
        import threading

        import ray

        if report_to is not None:  # where this attempt runs, told to the schedule's owner at once
            try:
                owner = ray.get_actor(report_to[0], namespace=report_to[1])
                owner.placed.remote(status_path, ray.get_runtime_context().get_node_id(), socket.gethostname())
            except Exception:  # bookkeeping: never in the attempt's way
                pass
        away_folder = None
        if luggage is not None and ray.get_runtime_context().get_node_id() != luggage["node"]:
            away_folder = tempfile.mkdtemp(prefix="jaxfit-run-")
            for name, data in luggage["files"].items():
                target = os.path.join(away_folder, name)
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                    f.write(data)  # private to this user: a pin is code, its key a secret
            env = dict(env)
            for var, name in luggage["inputs"].items():
                env[var] = os.path.join(away_folder, name)
            for var in luggage["outputs"]:
                env[var] = os.path.join(away_folder, "out", var)
            os.makedirs(os.path.join(away_folder, "out"), exist_ok=True)
            if "PYTHONPATH" in env:  # jaxfit's start-up hook, from the copy that travelled
                here = os.path.join(away_folder, "probe")
                parts = env["PYTHONPATH"].split(os.pathsep)
                env["PYTHONPATH"] = os.pathsep.join(here if p == luggage["probe_dir"] else p for p in parts)
            log_path = os.path.join(away_folder, "attempt.log")
            status_path = os.path.join(away_folder, "attempt.status.json")
            if not os.path.isdir(cwd):
                cwd = away_folder

        def come_back(code: int) -> int | dict[str, Any]:
            """The result: the code here; from another node, with what the scheduler keeps."""
            if away_folder is None:
                return code

            def read(path: str, most: int | None = None) -> bytes | None:
                try:
                    with open(path, "rb") as f:
                        if most is not None:
                            f.seek(max(0, os.path.getsize(path) - most))
                        return f.read()
                except OSError:
                    return None

            assert luggage is not None
            back = {
                "code": code,
                "node": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(),
                "log": read(log_path, luggage["log_bytes"]) or b"",
                "status": read(status_path),
                "outputs": {v: read(os.path.join(away_folder, "out", v)) for v in luggage["outputs"]},
            }
            shutil.rmtree(away_folder, ignore_errors=True)
            return back

        stop = {"asked": False}

        def on_cancel(_signum: int, _frame: object) -> None:
            # ray.cancel(ref) interrupts the main thread as SIGINT would: ask for a graceful stop.
            stop["asked"] = True

        def recorded_code() -> int | None:
            try:
                with open(status_path) as f:
                    return int(json.load(f)["exit_code"])
            except (OSError, ValueError, KeyError, TypeError):
                return None

        def write_pid_file(pid: int) -> None:
            try:
                with open("/proc/sys/kernel/random/boot_id") as f:
                    boot_id: str | None = f.read().strip()
            except OSError:
                boot_id = None
            tmp = status_path + ".pid.tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump({"pid": pid, "host": socket.gethostname(), "boot_id": boot_id}, f)
                os.replace(tmp, status_path + ".pid")
            except OSError:
                pass

        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, on_cancel) if in_main else None
        try:
            full_env = dict(os.environ)
            for name in (
                "RAY_JOB_ID",
                "RAY_RAYLET_PID",
                "RAY_LD_PRELOAD_ON_WORKERS",
                "SPT_NOENV",
                "RAY_worker_niceness",
            ):
                full_env.pop(name, None)
            if full_env.get("PYTHONBREAKPOINT", "").startswith("ray."):
                del full_env["PYTHONBREAKPOINT"]
            if not keep_omp:
                full_env.pop("OMP_NUM_THREADS", None)
            fraction_names = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
            if any(name in env for name in fraction_names):  # never both spellings: jax then starts on the CPU
                for name in fraction_names:
                    full_env.pop(name, None)
            full_env.update(env)
            gpu_ids = ray.get_gpu_ids()
            if gpu_ids:
                full_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)

            log_dir = os.path.dirname(log_path)
            if log_dir:
                os.makedirs(log_dir, exist_ok=True)
            for stale in (status_path, status_path + ".pid"):
                try:
                    os.unlink(stale)
                except FileNotFoundError:
                    pass
            if stop["asked"]:
                return come_back(-int(signal.SIGTERM))
            if planned_gpu_bytes and gpu_ids:  # its fraction is a share of the planned GPU's memory
                try:
                    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
                    out = subprocess.run(
                        [*query, "-i", str(gpu_ids[0])], capture_output=True, text=True, timeout=30
                    ).stdout.split()
                    gpu_bytes: int | None = int(float(out[0])) << 20
                except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                    gpu_bytes = None  # no nvidia-smi: nothing to compare with
                if gpu_bytes and abs(gpu_bytes - planned_gpu_bytes) > gpu_tolerance * planned_gpu_bytes:
                    with open(log_path, "ab") as log:
                        log.write(
                            (
                                f"jaxfit: not started on {socket.gethostname()}: Ray gave it GPU {gpu_ids[0]} of "
                                f"{gpu_bytes / 2**30:.1f} GiB, and it was planned for a GPU of "
                                f"{planned_gpu_bytes / 2**30:.1f} GiB (its memory fraction is a share of that); "
                                "give this node's GPUs a queue of their own, or use a cluster of alike GPUs\n"
                            ).encode()
                        )
                    return come_back(wrong_gpu)
            if os.path.isfile(runner):
                argv = [sys.executable, runner, status_path, "--", *command]
            else:  # this node lacks the checkout: run the runner from its shipped source
                argv = [sys.executable, "-c", runner_source, status_path, "--", *command]
            with open(log_path, "ab") as log:
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", "-c", guard, repr(float(grace_s)), status_path, *argv],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        env=full_env,
                        cwd=cwd,
                        start_new_session=True,
                    )
                except OSError as e:
                    log.write(f"jaxfit: cannot start the runner on {socket.gethostname()}: {e.strerror}\n".encode())
                    return come_back(127)
            assert proc.stdin is not None and proc.stdout is not None
            proc.wait()  # the guard's parent, which exits as soon as it has forked
            code: int | None = None
            told = False
            pending = b""
            with proc.stdin, proc.stdout:
                while True:
                    try:
                        if stop["asked"] and not told:
                            told = True
                            try:
                                proc.stdin.write(b"stop\n")
                                proc.stdin.flush()
                            except OSError:
                                pass
                        if not select.select([proc.stdout], [], [], 0.2)[0]:
                            continue
                        chunk = os.read(proc.stdout.fileno(), 4096)
                    except KeyboardInterrupt:  # only if the SIGINT handler could not be installed
                        stop["asked"] = True
                        continue
                    if not chunk:
                        break  # the guard has ended
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        word, _, rest = line.decode(errors="replace").partition(" ")
                        if word == "pid":
                            write_pid_file(int(rest))
                        elif word == "exit":
                            code = int(rest)
                        elif word == "error":
                            with open(log_path, "ab") as log:
                                log.write(f"jaxfit: {rest}\n".encode())
                            code = 127
            recorded = recorded_code()
            # The runner returns 128+n for a command killed by signal n; its file keeps the -n.
            if recorded is not None:
                return come_back(recorded)
            return come_back(code if code is not None else lost_code)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    lost_code, wrong_gpu, gpu_tolerance = RAY_LOST, WRONG_GPU, GPU_SIZE_TOLERANCE
    return jaxfit_attempt


OWNER_NAMESPACE = "jaxfit"
"""The Ray namespace of the schedules' owner actors."""


def _where(node: str, host: str) -> str:
    """An attempt's place, in words: its host and Ray's node id (shortened)."""
    return f"{host} (node {node[:12]})" if node else host


def owner_name(state_dir: str) -> str:
    """The name of the detached actor that owns a schedule's tasks on a cluster: one per state
    folder of one scheduling machine, so that ``--resume`` there finds it again."""
    import hashlib

    where = f"{socket.gethostname()}:{os.path.realpath(state_dir)}"
    return "jaxfit-schedule-" + hashlib.sha256(where.encode()).hexdigest()[:20]


def _make_owner_class() -> type:
    """The owner of a schedule's attempts on a Ray cluster: a detached actor that submits each
    attempt's task and keeps its reference, so the attempts belong to it and not to the
    scheduler's driver. When the scheduling machine dies, Ray keeps the actor and its tasks; the
    next ``jaxfit schedule --resume`` finds it by name and adopts them. Pickled by value, like the
    task."""

    class JaxfitScheduleOwner:
        def __init__(self, task: Callable[..., Any]) -> None:
            import ray

            self._task = ray.remote(task)
            self._refs: dict[str, Any] = {}
            self._outputs: dict[str, dict[str, str]] = {}
            self._placed: dict[str, tuple[str, str]] = {}

        def placed(self, key: str, node: str, host: str) -> None:
            """An attempt's task started on ``node`` (Ray's node id) of ``host``."""
            self._placed[key] = (node, host)

        def where(self, key: str) -> tuple[str, str] | None:
            """``(node, host)`` an attempt's task started on; None until it said."""
            return self._placed.get(key)

        def start(self, key: str, options: dict[str, Any], args: list[Any], outputs: dict[str, str]) -> bool:
            self._refs[key] = self._task.options(**options).remote(*args)
            self._outputs[key] = outputs
            return True

        def outputs(self, key: str) -> dict[str, str] | None:
            """Where the attempt's outputs land on the scheduling machine; None: not started here."""
            return self._outputs.get(key) if key in self._refs else None

        def poll(self, key: str) -> tuple[str, Any]:
            """``("running", None)``, ``("ended", result)``, ``("task_error", line)``, ``("lost",
            line)`` or ``("unknown", None)`` for a key this owner never started."""
            import ray

            ref = self._refs.get(key)
            if ref is None:
                return "unknown", None
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                return "running", None
            try:
                return "ended", ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                return "task_error", str(e)
            except ray.exceptions.RayError as e:
                return "lost", str(e)

        def cancel(self, key: str, force: bool) -> None:
            import ray

            ref = self._refs.get(key)
            if ref is not None:
                try:
                    ray.cancel(ref, force=force)
                except (ray.exceptions.RayError, ValueError):
                    pass

        def forget(self, key: str) -> None:
            self._refs.pop(key, None)
            self._outputs.pop(key, None)
            self._placed.pop(key, None)

        def live(self) -> list[str]:
            import ray

            refs = list(self._refs.items())
            ready, _ = ray.wait([r for _, r in refs], num_returns=len(refs), timeout=0) if refs else ([], [])
            done = set(ready)
            return [k for k, r in refs if r not in done]

    return JaxfitScheduleOwner


class RayHandle:
    """An attempt running as a Ray task.

    Attributes:
      pid: The runner's pid (leader of its process group) once the task has started it on this
        host, else None. Learnt from ``status_path + ".pid"`` by :meth:`poll`.
      ref: The task's ObjectRef (its result is the exit code).
      status_path: The runner's status file.
    """

    def __init__(
        self,
        ray: Any,
        ref: Any,
        status_path: str,
        log_path: str = "",
        outputs: Mapping[str, str] | None = None,
        owner: Any = None,
    ) -> None:
        self._ray = ray
        self.ref = ref
        self.status_path = status_path
        self.log_path = log_path
        self.outputs = dict(outputs or {})
        self.owner = owner
        """The schedule's owner actor that submitted the task (a cluster), keyed by ``status_path``;
        None: the task is this process's own (``ref``)."""
        self.pid: int | None = None
        self.host: str | None = None
        """Where the attempt runs: ``host (node <id>)``, once the task has said (a cluster), or the
        scheduler's host (a local Ray of one node)."""
        self._stop_signal: int | None = None
        self._code: int | None = None
        self._asked_where = 0.0

    def _outcome(self) -> tuple[str, Any] | None:
        """None while the task runs, else ``("ended", result)``, ``("task_error", text)`` or
        ``("lost", text)``."""
        ray = self._ray
        if self.owner is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if not ready:
                return None
            try:
                return "ended", ray.get(self.ref)
            except ray.exceptions.RayTaskError as e:  # the task's own code raised
                return "task_error", _first_line(e)
            except ray.exceptions.RayError as e:  # cancelled, or its worker or node died
                return "lost", _first_line(e)
        try:
            kind, value = ray.get(self.owner.poll.remote(self.status_path), timeout=30)
        except ray.exceptions.GetTimeoutError:
            return None  # the owner is busy or far: ask again at the next poll
        except ray.exceptions.RayError as e:
            return "lost", f"the schedule's owner actor is gone: {_first_line(e)}"
        if kind == "running":
            return None
        if kind == "unknown":
            return "lost", "the schedule's owner actor does not know this attempt"
        return kind, value if kind == "ended" else _first_line(str(value))

    def _note(self, text: str) -> None:
        """Add a line to the attempt's log here (an attempt lost with another node brings none back)."""
        if not self.log_path:
            return
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
            with open(self.log_path, "ab") as f:
                f.write(f"jaxfit: {text}\n".encode())

    def _learn_host(self) -> None:
        """Set :attr:`host` from the owner actor, which the task tells where it started (asked at
        most every 2 s until it answers)."""
        if self.host is not None or self.owner is None or time.monotonic() - self._asked_where < 2.0:
            return
        self._asked_where = time.monotonic()
        with contextlib.suppress(self._ray.exceptions.RayError, TimeoutError):
            placed = self._ray.get(self.owner.where.remote(self.status_path), timeout=5)
            if placed:
                self.host = _where(*placed)

    def _learn_pid(self) -> None:
        """Set :attr:`pid` from the task's pid file, when the runner runs on this host."""
        if self.pid is not None:
            return
        try:
            with open(_pid_path(self.status_path)) as f:
                info = json.load(f)
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if info.get("host") != socket.gethostname() or info.get("boot_id") != _boot_id():
            return  # another node: its pid means nothing here
        self.pid = pid

    def poll(self) -> int | None:
        """The exit code once the attempt has ended (negative: killed by that signal), else None.

        See the module's docstring for the codes of a task that failed or was cancelled.
        """
        if self._code is not None:
            return self._code
        self._learn_pid()
        self._learn_host()
        outcome = self._outcome()
        if outcome is None:
            return None
        kind, result = outcome
        if kind == "ended":
            if isinstance(result, dict):  # it ran on another node: keep what came back here
                _land(result, self.log_path, self.status_path, self.outputs)
                self.host = _where(str(result.get("node") or ""), str(result.get("host") or "?"))
                result = result["code"]
            code = int(result)
        elif kind == "task_error":
            code = RAY_TASK_ERROR
            self._note(f"its Ray task failed: {result}")
        else:
            code = RAY_LOST
            if self._stop_signal is None:
                self._note(f"this attempt was lost with its Ray worker or node: {result}")
        if self.owner is not None:  # what it brought back has landed here: the owner may let it go
            with contextlib.suppress(self._ray.exceptions.RayError):
                self.owner.forget.remote(self.status_path)
        if code == RAY_LOST:
            if (
                read_status(self.status_path) is None
                and self.pid is not None
                and _is_runner(self.pid, self.status_path)
            ):
                return None  # its runner is still being stopped
            recorded = read_status(self.status_path)  # read again: it may have ended meanwhile
            if recorded is not None:
                code = recorded
            elif self._stop_signal is not None:
                code = -self._stop_signal
        self._code = code
        return code

    def terminate(self) -> None:
        """Ask the attempt to stop: its guard SIGTERMs the runner's group, then SIGKILLs it after the grace.

        A task still waiting for its GPU share is dropped from Ray's queue.
        """
        if self._stop_signal is None:
            self._stop_signal = signal.SIGTERM
        self._cancel(force=False)

    def _cancel(self, force: bool) -> None:
        with contextlib.suppress(self._ray.exceptions.RayError, ValueError):
            if self.owner is not None:
                self.owner.cancel.remote(self.status_path, force)
            else:
                self._ray.cancel(self.ref, force=force)

    def kill(self) -> None:
        """Stop the attempt now: SIGKILL to the runner's group (when on this host) and a forced cancel."""
        self._stop_signal = signal.SIGKILL
        self._learn_pid()
        if self.pid is not None and _is_runner(self.pid, self.status_path):
            _signal_group(self.pid, signal.SIGKILL)
        self._cancel(force=True)


class RayLauncher:
    """Runs attempts as Ray tasks on a local Ray or a Ray cluster (see the module's docstring).

    Args:
      address: None to start a new local Ray on this machine (``num_gpus`` and ``num_cpus`` size
        it; Ray detects the GPUs when ``num_gpus`` is None; ``RAY_ADDRESS`` and clusters started
        with ``ray start`` are ignored), or the address of a running cluster to connect to:
        ``"auto"`` (``RAY_ADDRESS``, else the one started on this machine), ``"host:6379"``, or
        ``"ray://host:10001"`` (Ray Client). When this process has already initialised Ray, the
        launcher uses that connection and ignores these arguments.
      num_gpus: Logical GPUs of the local Ray (None: what Ray detects). Only without ``address``.
      num_cpus: CPUs of the local Ray (None: what Ray detects). Only without ``address``.
      grace_s: Seconds between the SIGTERM and the SIGKILL of a terminated attempt.

    Raises:
      ConfigError: ray is not installed, ``num_gpus``/``num_cpus`` were given with an address, or
        Ray could not start or connect.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_gpus: float | None = None,
        num_cpus: int | None = None,
        grace_s: float = GRACE_S,
    ) -> None:
        ray = _import_ray()
        self._ray = ray
        self.grace_s = grace_s
        self._owns_ray = False
        self._closed = False
        if address is not None and (num_gpus is not None or num_cpus is not None):
            raise ConfigError("num_gpus and num_cpus size a local Ray only; leave them out with a cluster address")
        self._local_gpus: float | None = None
        if not ray.is_initialized():
            self._init(address, num_gpus, num_cpus)
            self._owns_ray = True
            if address is None:  # a local Ray never grows: a GPU request it cannot meet would wait forever
                self._local_gpus = float(ray.cluster_resources().get("GPU", 0))
        self._task = ray.remote(_make_task_function())
        self._node = str(ray.get_runtime_context().get_node_id())  # the scheduler's node
        # A local Ray started here is one node for good: nothing need travel (a pin's executable
        # can be gigabytes); a cluster may place an attempt on any node.
        self._one_node = self._owns_ray and address is None
        # On a cluster, a detached actor per schedule owns the tasks: they outlive this driver,
        # and `--resume` adopts them. A local Ray started here ends with this process anyway.
        self.resumable = not self._one_node
        self._owners: dict[str, Any] = {}
        self._gpus_seen: tuple[float, float] | None = None
        self._guard_source = Path(GUARD).read_text()  # part of the package, like the runner
        try:
            self._runner_source = Path(RUNNER).read_text()
        except OSError:
            self._runner_source = ""

    def _init(self, address: str | None, num_gpus: float | None, num_cpus: int | None) -> None:
        kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
        if address is None:  # "local": a new Ray, whatever RAY_ADDRESS or a `ray start` left behind says
            kwargs.update(address="local", num_gpus=num_gpus, num_cpus=num_cpus, include_dashboard=False)
        else:
            check_reachable(address)
            kwargs["address"] = address
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if in_main else None
        try:
            self._ray.init(**kwargs)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            where = "start a local Ray" if address is None else f"connect to the Ray cluster at {address!r}"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"cannot {where}: {first}") from None
        # ray.init makes SIGTERM raise SystemExit; keep a handler the caller had installed.
        if in_main and previous not in (None, signal.SIG_DFL):
            signal.signal(signal.SIGTERM, previous)

    def start(self, spec: LaunchSpec) -> RayHandle:
        """Submit the attempt's Ray task; it starts once Ray finds ``spec.gpu_share`` of a GPU free."""
        if self._closed:
            raise ConfigError("the ray launcher is closed")
        num_gpus = float(spec.gpu_count) if spec.gpu_count > 1 else ray_gpu_request(spec.gpu_share)
        if num_gpus > 0 and self._local_gpus == 0:
            raise ConfigError("the local Ray found no GPU: give it logical GPUs (num_gpus) or use a cluster with GPUs")
        for stale in (spec.status_path, _pid_path(spec.status_path)):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        luggage = None if self._one_node else _luggage(spec, self._node)
        options: dict[str, Any] = {
            "num_gpus": num_gpus,
            "num_cpus": TASK_NUM_CPUS,
            "max_retries": 0,
            "retry_exceptions": False,
            "name": f"jaxfit:{spec.name}#{spec.attempt}",
            "runtime_env": _RUNTIME_ENV,
        }
        args = [
            list(spec.command),
            dict(spec.env),
            spec.log_path,
            spec.status_path,
            spec.cwd,
            RUNNER,
            self._runner_source,
            self._guard_source,
            float(self.grace_s),
            "OMP_NUM_THREADS" in os.environ,
            luggage,
            spec.gpu_total_bytes,
        ]
        outputs = {v: spec.env[v] for v in luggage["outputs"]} if luggage else {}
        if not self.resumable:
            ref = self._task.options(**options).remote(*args)
            handle = RayHandle(self._ray, ref, spec.status_path, spec.log_path, outputs)
            handle.host = _where(self._node, socket.gethostname())  # a local Ray of one node: here
            return handle
        owner = self._owner(spec.status_path, create=True)
        args.append([owner_name(os.path.dirname(os.path.dirname(os.path.abspath(spec.status_path)))), OWNER_NAMESPACE])
        try:
            self._ray.get(owner.start.remote(spec.status_path, options, args, outputs), timeout=300)
        except self._ray.exceptions.RayError as e:
            raise ConfigError(
                f"the schedule's owner actor on the Ray cluster cannot start runs: {_first_line(e)}"
            ) from None
        return RayHandle(self._ray, None, spec.status_path, spec.log_path, outputs, owner=owner)

    def _owner(self, status_path: str, *, create: bool) -> Any:
        """The owner actor of the schedule whose logs folder holds ``status_path`` (None when it
        does not exist and ``create`` is False)."""
        name = owner_name(os.path.dirname(os.path.dirname(os.path.abspath(status_path))))
        if name in self._owners:
            return self._owners[name]
        ray = self._ray
        try:
            owner = ray.get_actor(name, namespace=OWNER_NAMESPACE)
        except ValueError:
            if not create:
                return None
            owner = (
                ray.remote(_make_owner_class())
                .options(
                    name=name,
                    namespace=OWNER_NAMESPACE,
                    lifetime="detached",
                    get_if_exists=True,
                    num_cpus=0,
                    max_concurrency=16,
                    resources={"node:__internal_head__": 0.001},  # the cluster's own node, not a worker's
                    runtime_env=_RUNTIME_ENV,
                )
                .remote(_make_task_function())
            )
        self._owners[name] = owner
        return owner

    def cluster_gpus(self) -> float | None:
        """The GPUs of the cluster's live nodes (Ray's logical ``GPU`` resource), read at most
        every :data:`CLUSTER_REFRESH_S`; None on a local Ray started here (the plan's GPUs)."""
        if self._one_node:
            return None
        now = time.monotonic()
        if self._gpus_seen is None or now - self._gpus_seen[0] > CLUSTER_REFRESH_S:
            try:
                gpus = float(self._ray.cluster_resources().get("GPU", 0.0))
            except Exception:  # the GCS is briefly away: keep the last reading
                return self._gpus_seen[1] if self._gpus_seen else None
            self._gpus_seen = (now, gpus)
        return self._gpus_seen[1]

    def adopt(self, pid: int | None, status_path: str) -> RayHandle | None:
        """The attempt the schedule's owner actor still holds for ``status_path`` (its task alive,
        or ended while no scheduler was there); None on a local Ray or when the owner lost it."""
        if not self.resumable:
            return None
        owner = self._owner(status_path, create=False)
        if owner is None:
            return None
        try:
            outputs = self._ray.get(owner.outputs.remote(status_path), timeout=120)
        except self._ray.exceptions.RayError:
            return None
        if outputs is None:
            return None
        log_path = status_path.removesuffix(".status.json") + ".log"
        return RayHandle(self._ray, None, status_path, log_path, outputs, owner=owner)

    def close(self) -> None:
        """Shut Ray down (or disconnect) if this launcher initialised it; idempotent."""
        if self._closed:
            return
        self._closed = True
        for owner in self._owners.values():  # an owner with live attempts stays for --resume
            with contextlib.suppress(self._ray.exceptions.RayError):
                if not self._ray.get(owner.live.remote(), timeout=60):
                    self._ray.kill(owner)
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
