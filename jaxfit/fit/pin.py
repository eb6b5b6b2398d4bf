"""Pins: the executable that proved a fit's answer, kept where the training process will load it.

A fit proves ``peak(answer) <= budget`` on the program its compile child built. Near the limit XLA
does not build the same program twice (GPU autotuning times kernels; docs/guides/facts.md #10), so the
training process's own compile can need more and run out of memory. A *pin* hands the proven
program over: the compile child serialises the executable that answered
(``jax.experimental.serialize_executable``, the bytes JAX's persistent cache stores), and jaxfit's
start-up hook in the training process loads it at the first call of the step when the step lowers
to the same program (same fingerprint, jax version, ``XLA_FLAGS`` and device), or else compiles
the step and checks it against the budget before any step runs (:mod:`jaxfit._probe.jaxfit_pin`).

A pin is a folder ``<cache>/pins/<id>/`` holding ``pin.json`` (what the hook checks, and the
proof's numbers, with the executable's size and SHA-256) and ``executable.bin``; a pin whose
executable no longer matches them is not used (:meth:`Pin.usable`), nor loaded by the hook. The id is the answer cache's key of the question when it
has one, so a cached answer finds its pin; pins are disposable: the least recently used beyond
:data:`MAX_PINS` (or :data:`MAX_TOTAL_BYTES`) are removed, and a schedule copies the pins of its
runs into its own state folder. Writing a pin never fails a fit: an unwritable or full cache
folder, or a backend that cannot serialise, leaves the answer standing, marked not pinned, with
the reason in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxfit._probe import jaxfit_trust as trust
from jaxfit._probe.jaxfit_cap import POOL_ENV
from jaxfit._probe.jaxfit_pin import PIN_ENV, REPORT_ENV, load_pin
from jaxfit.errors import ConfigError
from jaxfit.fit.budget import format_bytes, fraction_variable
from jaxfit.fit.cache import default_cache_path
from jaxfit.fit.command import PROBE_DIR
from jaxfit.fit.compiler import CompileChild, DeviceInfo
from jaxfit.fit.memory import MemoryReport

PIN_FILE = "pin.json"
EXECUTABLE_FILE = "executable.bin"
MAX_PINS = 32
"""Pins kept in the cache (least recently used first out)."""
MAX_TOTAL_BYTES = 8 << 30
"""Bytes of pins kept in the cache (least recently used first out)."""
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Pin:
    """A stored proven program.

    Attributes:
      path: Its ``pin.json``.
      step_name: The name of the jitted step function the training process's hook replaces.
      batch_size: The batch it was compiled at.
      peak_bytes: Its compiled peak (the program that is written, byte for byte).
      budget_bytes: The budget the fit proved it against (the hook's guard uses it too).
      fingerprint: The SHA-256 of the step's StableHLO text.
      executable_bytes: Size of the serialised executable.
      executable_sha256: Its SHA-256 (empty in pins written before it was recorded).
    """

    path: str
    step_name: str
    batch_size: int
    peak_bytes: int
    budget_bytes: int
    fingerprint: str
    executable_bytes: int
    executable_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pin:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def usable(self) -> bool:
        """Whether both files are still there and the executable is whole: its size and (when
        recorded) its SHA-256 as written. A truncated or altered executable would not load, and the
        training process would compile its own program instead of the proven one."""
        folder = Path(self.path).parent
        executable = folder / EXECUTABLE_FILE
        try:
            if not Path(self.path).is_file() or executable.stat().st_size != self.executable_bytes:
                return False
            return not self.executable_sha256 or file_sha256(executable) == self.executable_sha256
        except OSError:
            return False


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def pins_root(use_cache: bool = True) -> Path:
    """``<jaxfit cache folder>/pins``; with the cache off (``--no-cache``, which writes nothing to the
    cache), this user's private folder of the temporary directory instead
    (:func:`jaxfit._probe.jaxfit_trust.temp_root`), pruned the same way."""
    if use_cache:
        return default_cache_path().parent / "pins"
    return Path(trust.temp_root())


def private_pins_root(root: Path) -> tuple[Path, str | None]:
    """``(folder, note)``: ``root`` made private (:func:`jaxfit._probe.jaxfit_trust.private_folder`),
    or, when the cache's pins folder cannot be (a cache folder that is a file, unwritable or
    another user's), this user's private temporary pins folder, with a note saying why.

    Raises:
      UntrustedPin: neither can hold a pin.
    """
    try:
        return Path(trust.private_folder(str(root))), None
    except (OSError, trust.UntrustedPin) as e:
        fallback = Path(trust.temp_root())
        if root == fallback:
            raise trust.UntrustedPin(f"{root}: {getattr(e, 'strerror', None) or e}") from None
        why = f"{root} cannot hold pins ({getattr(e, 'strerror', None) or e})"
        try:
            return Path(trust.private_folder(str(fallback))), f"{why}: pinned in {fallback}"
        except (OSError, trust.UntrustedPin) as e2:
            raise trust.UntrustedPin(f"{why}, nor {fallback} ({getattr(e2, 'strerror', None) or e2})") from None


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def prune(root: Path | None = None, *, keep: Path | None = None) -> None:
    """Remove the least recently used pins beyond :data:`MAX_PINS` / :data:`MAX_TOTAL_BYTES`, and
    leftovers of interrupted writes (folders without ``pin.json`` older than an hour)."""
    root = root or pins_root()
    try:
        folders = [f for f in root.iterdir() if f.is_dir()]
    except OSError:
        return
    now = time.time()
    live = []
    for folder in folders:
        pin_file = folder / PIN_FILE
        try:
            live.append((pin_file.stat().st_mtime, folder))
        except OSError:
            try:
                if now - folder.stat().st_mtime > 3600:
                    shutil.rmtree(folder, ignore_errors=True)
            except OSError:
                pass
    live.sort(reverse=True)  # newest first
    total = 0
    for n, (_, folder) in enumerate(live):
        try:
            total += _folder_bytes(folder)
        except OSError:
            continue
        if folder != keep and (n >= MAX_PINS or total > MAX_TOTAL_BYTES):
            shutil.rmtree(folder, ignore_errors=True)


def find(key: str | None) -> Pin | None:
    """The pin stored for a question's key, if it is still whole (and marks it as just used)."""
    if key is None:
        return None
    path = pins_root() / key / PIN_FILE
    try:
        pin = Pin.from_dict(load_pin(str(path))["summary"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pin.usable():
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return pin


def pin_answer(
    child: CompileChild,
    batch: int,
    *,
    key: str | None,
    info: DeviceInfo,
    proven: MemoryReport,
    budget_bytes: int,
    limit_bytes: int,
    mem_fraction: float,
    root: Path | None = None,
) -> tuple[Pin | None, str | None]:
    """Have ``child`` write the program it compiled at ``batch``, and describe it in ``pin.json``
    (in ``root``, default :func:`pins_root`).

    Returns:
      ``(pin, note)``: the pin (None when it could not be made) and a one-line note for people
      (why it is not pinned, or that the pinned program had to be compiled again), or None.
    """
    if info.topology == "mock":
        return None, "not pinned: compiled for a mocked topology of GPUs this machine does not have"
    if info.topology == "target":
        return None, "not pinned: an estimate for a GPU that is not here (deviceless, untuned)"
    step_name = str(child.workload_info.get("description", {}).get("step_name") or "")
    if not step_name:
        return None, "not pinned: the step's function name is unknown"
    try:
        root, moved = private_pins_root(root or pins_root())
        in_cache = root != Path(trust.temp_root())  # --no-cache's pins are signed outside the cache
        trust.load_key(create=True, in_cache=in_cache)
    except trust.UntrustedPin as e:
        return None, f"not pinned: {e}"
    folder = root / (key or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
    try:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(mode=0o700)
    except OSError as e:
        return None, f"not pinned: cannot write to {root}: {e.strerror or e}"
    reply = child.pin(batch, str(folder / EXECUTABLE_FILE))
    with contextlib.suppress(OSError):
        os.chmod(folder / EXECUTABLE_FILE, 0o600)
    pin, note = _describe(
        reply,
        folder,
        child=child,
        batch=batch,
        info=info,
        proven=proven,
        budget_bytes=budget_bytes,
        limit_bytes=limit_bytes,
        mem_fraction=mem_fraction,
        step_name=step_name,
        key=key,
        in_cache=in_cache,
    )
    if pin is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        prune(root, keep=folder)
        if moved:
            note = f"{note}; {moved}" if note else moved
    return pin, note


def recompiled_verdict(written: MemoryReport, proven: MemoryReport, budget_bytes: int) -> tuple[str | None, str | None]:
    """``(refusal, note)`` for a program compiled again for the pin (its proof came from the cache).

    The program written is held to the proof's own rule: its peak plus, on a GPU, the loop's next
    batch (``proven.next_input_bytes``; the written program's report is the child's, which does not
    carry it) within the budget. A refusal says the pin cannot be made; a note says the peak moved
    but still fits; both are ``None`` when the peak is the proven one.
    """
    if written.peak_bytes == proven.peak_bytes:
        return None, None
    need = dataclasses.replace(written, next_input_bytes=proven.next_input_bytes)
    if need.need_bytes > budget_bytes:
        return (
            f"not pinned: compiled again for the pin (the proof came from jaxfit's cache), the program "
            f"needs {need.need_words()}, over the budget of {format_bytes(budget_bytes)}; fit again with --no-cache"
        ), None
    return None, (
        f"the pinned program was compiled again (the proof came from jaxfit's cache): it needs "
        f"{need.need_words()}, within the budget"
    )


def _describe(
    reply: Mapping[str, Any],
    folder: Path,
    *,
    child: CompileChild,
    batch: int,
    info: DeviceInfo,
    proven: MemoryReport,
    budget_bytes: int,
    limit_bytes: int,
    mem_fraction: float,
    step_name: str,
    key: str | None,
    in_cache: bool,
) -> tuple[Pin | None, str | None]:
    if not reply.get("ok"):
        return None, f"not pinned: the program could not be written ({str(reply.get('error'))[:300]})"
    written = MemoryReport.from_dict(reply["memory"])
    try:
        size, digest = (folder / EXECUTABLE_FILE).stat().st_size, file_sha256(folder / EXECUTABLE_FILE)
    except OSError as e:
        return None, f"not pinned: cannot read the program written: {e.strerror or e}"
    if size != int(reply["bytes"]):
        return None, f"not pinned: the program written has {size} bytes of {reply['bytes']}"
    note = None
    if reply.get("recompiled"):
        refusal, note = recompiled_verdict(written, proven, budget_bytes)
        if refusal:
            return None, refusal
    pin = Pin(
        path=str(folder / PIN_FILE),
        step_name=step_name,
        batch_size=batch,
        peak_bytes=written.peak_bytes,
        budget_bytes=budget_bytes,
        fingerprint=str(reply["fingerprint"]),
        executable_bytes=size,
        executable_sha256=digest,
    )
    data = {
        "format": FORMAT,
        "summary": pin.to_dict(),
        "step_name": step_name,
        "batch_size": batch,
        "fingerprint": pin.fingerprint,
        "executable": EXECUTABLE_FILE,
        "executable_bytes": size,
        "executable_sha256": digest,
        "peak_bytes": written.peak_bytes,
        # on a GPU, the loop's next batch the pool must also hold (the start-up check counts it)
        "next_input_bytes": proven.next_input_bytes,
        "memory": written.to_dict(),
        "budget_bytes": budget_bytes,
        "limit_bytes": limit_bytes,
        "mem_fraction": mem_fraction,
        "jax_version": info.jax_version,
        "xla_flags": reply.get("xla_flags") or "",
        "platform": info.platform,
        "device_kind": info.device_kind,
        "device_count": info.device_count,
        "execution_devices": reply.get("execution_devices"),
        "workload": child.workload_info.get("name"),
        "question_key": key,
        "created_at": time.time(),
    }
    try:
        data[trust.SIGNATURE_FIELD] = trust.sign(data, digest, in_cache)
        write_pin_file(folder / PIN_FILE, data)
    except (OSError, ConfigError, trust.UntrustedPin) as e:
        return None, f"not pinned: cannot write {folder / PIN_FILE}: {getattr(e, 'strerror', None) or e}"
    return pin, note


def write_pin_file(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``pin.json``, private to this user (mode 0600, as written whole)."""
    from jaxfit.files import write_json

    write_json(path, data)
    os.chmod(path, 0o600)


def discard_pin(pin: Pin | None) -> None:
    """Remove a pin that is not the answer (a fraction that did not win)."""
    if pin is not None:
        shutil.rmtree(Path(pin.path).parent, ignore_errors=True)


def rehome(pin: Pin | None, key: str | None) -> Pin | None:
    """Move ``pin`` to the folder of the question ``key`` beside it (where :func:`find` looks)."""
    if pin is None or key is None:
        return pin
    target = Path(pin.path).parent.parent / key
    source = Path(pin.path).parent
    if source == target:
        return pin
    try:
        if target.exists():
            shutil.rmtree(target)
        source.rename(target)
        moved = dataclasses.replace(pin, path=str(target / PIN_FILE))
        data = json.loads((target / PIN_FILE).read_text())
        data["summary"] = moved.to_dict()  # outside the signature
        write_pin_file(target / PIN_FILE, data)
    except (OSError, ConfigError):
        return pin
    return moved


def run_environment(pin: Pin | None, mem_fraction: float) -> dict[str, str]:
    """The environment that runs the proven program in a user's own shell: the fraction, jaxfit's
    start-up hook on PYTHONPATH (prepend it to any PYTHONPATH of your own) and the pin."""
    env = {fraction_variable(): f"{mem_fraction:g}"}  # the spelling of the shell it is pasted in
    if pin is not None:
        env.update({"PYTHONPATH": PROBE_DIR, PIN_ENV: pin.path})
        key = trust.signing_key_path(pin.path) or trust.key_path()
        if key != trust.default_key_path():  # a shell without jaxfit's variables finds the key that signed it
            env[trust.KEY_ENV] = key
    return env


def env_words(env: Mapping[str, str]) -> list[str]:
    """``KEY=value`` words for a shell, quoted; a PYTHONPATH is prepended to the user's own."""
    import shlex

    words = [f"{key}={shlex.quote(value)}" for key, value in env.items() if key != "PYTHONPATH"]
    if "PYTHONPATH" in env:
        words.insert(1, f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])}${{PYTHONPATH:+:$PYTHONPATH}}")
    return words


def copy_to(pin: Pin, folder: Path) -> Pin:
    """A copy of ``pin`` in ``folder`` (a schedule keeps its runs' pins in its own state folder, out
    of reach of the cache's pruning)."""
    trust.private_folder(str(folder))
    source = Path(pin.path).parent
    for name in (EXECUTABLE_FILE, PIN_FILE):
        shutil.copyfile(source / name, folder / name)
        os.chmod(folder / name, 0o600)
    copied = dataclasses.replace(pin, path=str(folder / PIN_FILE))
    data = json.loads((folder / PIN_FILE).read_text())
    data["summary"] = copied.to_dict()  # outside the signature
    write_pin_file(folder / PIN_FILE, data)
    return copied


def read_report(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """What the start-up hook wrote about the step it ran (``program_pinned``...), or None."""
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pool_environment(mem_fraction: float, gpu_total_bytes: int | None) -> dict[str, str]:
    """The variable that makes the start-up hook check, before the first step, that the process
    holds the pool of ``mem_fraction`` of a GPU of ``gpu_total_bytes`` (CUDA's total as JAX counts
    it, :func:`jaxfit.fit.devices.cuda_total_bytes`), and stop it when not
    (:mod:`jaxfit._probe.jaxfit_cap`); nothing without a GPU."""
    if not gpu_total_bytes:
        return {}
    return {POOL_ENV: str(round(float(f"{mem_fraction:g}") * gpu_total_bytes))}


def hook_environment(pin: Pin | None, report_path: str | None) -> dict[str, str]:
    """The variables that make the hook load ``pin`` in a process jaxfit starts, and report to
    ``report_path``."""
    if pin is None:
        return {}
    env = {PIN_ENV: pin.path, "JAXFIT_PIN_STEP_NAME": pin.step_name}
    if report_path:
        env[REPORT_ENV] = str(report_path)
    return env
