"""Budgets: memory sizes, fractions and the bytes they give.

A process started with ``XLA_PYTHON_CLIENT_MEM_FRACTION=f`` gets an allocator limit
(``bytes_limit``) of about ``f x`` the CUDA total of the device (docs/guides/facts.md #4). Its step must fit in
that limit, less any headroom the user keeps. Each process also holds memory *outside* that limit
(CUDA context, libraries: ~618 MiB on an H200, docs/guides/facts.md #5), which co-located processes must add.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, MutableMapping

from jaxfit.errors import ConfigError

FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
"""The fraction's spelling every jaxlib reads."""
NEW_FRACTION_VARIABLE = "XLA_CLIENT_MEM_FRACTION"
"""XLA's new spelling (openxla/xla#16457): newer jaxlibs read it too, and refuse to start a GPU
client when both are set ("XLA_CLIENT_MEM_FRACTION is specified together with
XLA_PYTHON_CLIENT_MEM_FRACTION")."""


def fraction_variable(env: Mapping[str, str] | None = None) -> str:
    """The spelling jaxfit sets for a process: the new one when the environment (default: this
    process's) already uses it alone, so that the two never meet; else the one every jaxlib reads."""
    env = os.environ if env is None else env
    return (
        NEW_FRACTION_VARIABLE
        if env.get(NEW_FRACTION_VARIABLE) and not env.get(FRACTION_VARIABLE)
        else FRACTION_VARIABLE
    )


def set_fraction(env: MutableMapping[str, str], value: str) -> MutableMapping[str, str]:
    """Set the fraction in a whole environment (one that replaces the process's): under
    :func:`fraction_variable` of it, the other spelling removed. Returns ``env``."""
    name = fraction_variable(env)
    for other in (FRACTION_VARIABLE, NEW_FRACTION_VARIABLE):
        env.pop(other, None)
    env[name] = value
    return env


def overlay_environment(base: Mapping[str, str], added: Mapping[str, str]) -> dict[str, str]:
    """``base`` (a process's environment) with ``added`` over it, where a fraction in ``added``
    replaces ``base``'s in either spelling: jax 0.11.2 given both starts on the CPU (measured on an
    H100, benchmarks/JOURNAL.md section 16), so a shell's other spelling must not reach the run."""
    env = dict(base)
    if FRACTION_VARIABLE in added or NEW_FRACTION_VARIABLE in added:
        env.pop(FRACTION_VARIABLE, None)
        env.pop(NEW_FRACTION_VARIABLE, None)
    env.update(added)
    return env


def check_pool_environment(env: Mapping[str, str] | None = None) -> None:
    """That the environment (default: this process's) leaves the fraction a hard cap.

    Raises:
      ConfigError: ``XLA_PYTHON_CLIENT_ALLOCATOR=platform``, under which the allocator has no limit
        (on an H100 with jax 0.11.2 one process under fraction 0.3 took 84.6 GB, benchmarks/JOURNAL.md
        section 16).
    """
    env = os.environ if env is None else env
    if env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower() == "platform":
        raise ConfigError(
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform gives JAX an allocator without a limit, so no memory fraction is "
            "a cap and no answer of jaxfit holds; unset XLA_PYTHON_CLIENT_ALLOCATOR"
        )


KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": KiB,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MiB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GiB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

#: Per-process device memory outside the XLA pool, measured on an H200 (docs/guides/facts.md #5). Used only
#: when it cannot be measured on the device at hand; results say which one they used.
H200_PROCESS_OVERHEAD_BYTES = 618 * MiB


def parse_size(text: str | int) -> int:
    """Parse a memory size such as ``96GiB``, ``80GB``, ``512MiB`` or ``1.5e9`` into bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers of
    1024, as their names say. A bare number is bytes.

    Raises:
      ConfigError: the text is not a positive size.
    """
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            try:
                value = int(float(text))
            except ValueError:
                raise ConfigError(
                    f"cannot read {text!r} as a memory size; write e.g. 96GiB, 80GB or 24576MiB"
                ) from None
        else:
            value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"memory size {text!r} must be positive; write e.g. 96GiB")
    return value


def format_bytes(n: int | float | None) -> str:
    """``n`` bytes as a short human string in binary units (``17.59 GiB``); ``-`` for None."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


def check_fraction(fraction: float, what: str = "--mem-fraction") -> float:
    """Validate a memory fraction in (0, 1].

    Raises:
      ConfigError: the fraction is outside (0, 1].
    """
    if not (isinstance(fraction, (int, float)) and math.isfinite(fraction) and 0 < fraction <= 1):
        raise ConfigError(f"{what} must be in (0, 1], got {fraction!r}; e.g. {what} 0.45")
    return float(fraction)


def planned_fraction(fraction: float, device_memory: int, total: int) -> float:
    """The fraction of a GPU of ``total`` bytes whose limit is ``fraction x device_memory``: how
    a card planned with ``--device-memory`` is compiled and run on this GPU, whether the card is
    smaller or a little larger (0.9 of 80 GiB is 0.909 of an H100's 79.18 GiB).

    Raises:
      ConfigError: more than the whole GPU.
    """
    share = fraction * device_memory / total
    if share > 1:
        raise ConfigError(
            f"--device-memory {format_bytes(device_memory)} at fraction {fraction} needs more than "
            f"this GPU's {format_bytes(total)}; plan on a larger GPU or lower the fraction"
        )
    return share


def budget_bytes(limit_bytes: int, headroom_bytes: int = 0) -> int:
    """The bytes a step may use: the allocator limit less the user's headroom."""
    return int(limit_bytes) - int(headroom_bytes)


def fraction_for_bytes(needed_bytes: int, total_bytes: int, step: float = 0.01) -> float:
    """The smallest multiple of ``step`` whose share of ``total_bytes`` holds ``needed_bytes``.

    May exceed 1.0: the caller decides what a fraction above one means (it does not fit).
    """
    units = math.ceil(needed_bytes / (total_bytes * step) - 1e-9)
    return round(max(1, units) * step, 10)
