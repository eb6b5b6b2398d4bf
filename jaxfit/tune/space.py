"""The space ``jaxfit tune`` searches: settings (remat, precision, or a script's own flags) crossed
with the micro-batch and accumulation that keep a global batch (pure logic)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from jaxfit.errors import ConfigError

REMAT_CHOICES = ("none", "full", "dots", "dots_no_batch")
"""Rematerialisation of the built-in examples: off, save nothing (recompute each block), save the
outputs of matrix products, or only those without a batch dimension."""
PRECISION_CHOICES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of the space before batching: a name for people, and how to apply it.

    Attributes:
      name: ``remat=dots,precision=bfloat16`` (or the script flags, joined).
      overrides: Example config overrides (``--set``) that make it, for built-in examples.
      flags: Command-line flags that make it, for scripts (``--remat=dots``).
    """

    name: str
    overrides: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()

    @property
    def remat(self) -> bool:
        """Whether this setting rematerialises (its compiled FLOPs then include the recompute)."""
        text = self.name.replace(" ", "")
        return any(f"remat={v}" in text for v in ("full", "dots", "dots_no_batch", "true", "nothing"))


REMAT_FLAG = "--remat"
"""A script flag read as rematerialisation (``scripts/train.py``'s; ``none`` is off)."""


def plain_twin(setting: Setting) -> str | None:
    """The name of the same setting without rematerialisation (``remat=full,precision=bfloat16`` ->
    ``remat=none,precision=bfloat16``; a script's ``--remat=full --precision=bfloat16`` ->
    ``--remat=none --precision=bfloat16``), or None for a setting that does not rematerialise. Of a
    script's flags only ``--remat`` is read, and its twin is its value ``none``: whether that
    setting is tuned too, and fitted, the caller checks.

    At one micro-batch the rematerialising program does the twin's work and recomputes part of its
    forward pass besides, so it is never the faster of the two where the twin fits (measured on
    H100s: gpt-small and vit-small, every micro-batch, 6-15 % slower; benchmarks/JOURNAL.md section
    17): a tune proves a remat setting only at micro-batches its twin cannot hold."""
    if setting.flags:
        values = {flag.partition("=")[0]: flag.partition("=")[2] for flag in setting.flags}
        if values.get(REMAT_FLAG, "none") == "none":
            return None
        return " ".join(f"{REMAT_FLAG}=none" if f.startswith(f"{REMAT_FLAG}=") else f for f in setting.flags)
    if dict(setting.overrides).get("remat") != "true":
        return None
    return ",".join("remat=none" if part.startswith("remat=") else part for part in setting.name.split(","))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A setting at one micro-batch: ``global_batch = micro_batch x accum_steps``."""

    setting: Setting
    micro_batch: int
    accum_steps: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum_steps


def example_settings(remat: Sequence[str], precision: Sequence[str], has_remat: bool = True) -> list[Setting]:
    """Every (remat, precision) pair for a built-in example, as config overrides; for a model
    without rematerialisation (``has_remat`` False: the MLPs), every precision alone.

    Raises:
      ConfigError: an unknown choice, or a remat other than ``none`` for a model without one.
    """
    if not has_remat:
        if any(r != "none" for r in remat):
            raise ConfigError("this example has no rematerialisation (no remat config key); drop --remat")
        for value in precision:
            if value not in PRECISION_CHOICES:
                raise ConfigError(f"--precision {value!r} is not one of: {', '.join(PRECISION_CHOICES)}")
        return [Setting(f"precision={p}", (("dtype", p),)) for p in dict.fromkeys(precision)]
    for value in remat:
        if value not in REMAT_CHOICES:
            raise ConfigError(f"--remat {value!r} is not one of: {', '.join(REMAT_CHOICES)}")
    for value in precision:
        if value not in PRECISION_CHOICES:
            raise ConfigError(f"--precision {value!r} is not one of: {', '.join(PRECISION_CHOICES)}")
    out = []
    for r, p in itertools.product(dict.fromkeys(remat), dict.fromkeys(precision)):
        overrides: dict[str, str] = {"dtype": p, "remat": "false" if r == "none" else "true"}
        if r != "none":
            overrides["remat_policy"] = "nothing" if r == "full" else r
        out.append(Setting(f"remat={r},precision={p}", tuple(overrides.items())))
    return out


def parse_axis(text: str) -> tuple[str, list[str]]:
    """``--remat=none,dots,full`` -> ``("--remat", ["none", "dots", "full"])``.

    Raises:
      ConfigError: not ``--FLAG=V1,V2,...``.
    """
    flag, sep, values = text.partition("=")
    choices = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not flag.startswith("-") or not choices:
        raise ConfigError(f"--axis {text!r} must look like --FLAG=VALUE1,VALUE2, e.g. --axis=--remat=none,dots,full")
    return flag, list(dict.fromkeys(choices))


def script_settings(axes: Sequence[str]) -> list[Setting]:
    """The cross product of script flag axes (``--axis=--remat=none,full --axis=--precision=...``)."""
    parsed = [parse_axis(a) for a in axes]
    flags = [flag for flag, _ in parsed]
    if len(set(flags)) != len(flags):
        raise ConfigError(f"an --axis flag is given twice: {', '.join(flags)}; give each flag's values once")
    if not parsed:
        return [Setting("as given")]
    out = []
    for values in itertools.product(*(choices for _, choices in parsed)):
        chosen = tuple(f"{flag}={value}" for flag, value in zip(flags, values, strict=True))
        out.append(Setting(" ".join(chosen), flags=chosen))
    return out


def micro_batches(global_batch: int | None, largest: int, *, multiple_of: int = 1, most: int = 3) -> list[int]:
    """The micro-batches to try: those that divide ``global_batch`` (multiples of ``multiple_of``)
    up to the largest that fits, largest first, at most ``most`` of them (smaller ones step more
    often for the same samples: rarely faster). Without a global batch: the largest alone."""
    if largest < 1:
        return []
    if global_batch is None:
        return [largest]
    fits = [m for m in range(min(largest, global_batch), 0, -1) if global_batch % m == 0 and m % multiple_of == 0]
    return fits[:most]


def upper_bound_samples_per_second(global_batch: int, flops_per_step: float | None, peak_flops: float | None) -> float:
    """The most samples per second a candidate can reach: its step's FLOPs at the device's peak rate
    (infinite when either is unknown, so nothing is pruned on a guess)."""
    if not flops_per_step or not peak_flops:
        return float("inf")
    return global_batch * peak_flops / flops_per_step
