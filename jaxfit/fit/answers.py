"""The answer cache: a whole fit's result, keyed by the question, so a repeat answers in a fraction
of a second without starting JAX (its proven program too, :mod:`jaxfit.fit.pin`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxfit._probe.jaxfit_manifest import check as check_manifest
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.cache import AnswerCache
from jaxfit.fit.devices import gpu_table
from jaxfit.fit.options import FitOptions
from jaxfit.fit.pin import find as find_pin
from jaxfit.fit.results import FitResult
from jaxfit.fit.sources import ScriptSource, Source
from jaxfit.versions import jax_version, jaxfit_version


def device_identity() -> str:
    """A cheap identity of the device a child would see, without initialising JAX here: the visible
    GPUs as nvidia-smi lists them, else this machine's memory and cores."""
    platforms = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
    if "cpu" not in platforms.split(",")[:1]:
        table = gpu_table("index,name,memory.total")
        if table is not None:
            return f"gpu:{os.environ.get('CUDA_VISIBLE_DEVICES')}:{table}"
    from jaxfit._probe.jaxfit_compile_server import host_memory_bytes

    return f"cpu:{host_memory_bytes()}:{os.cpu_count()}"


def answer_key(question: Mapping[str, Any], source: Source) -> str | None:
    """The key of ``question`` about ``source`` on this device and these versions (None: the source
    cannot be identified). A script's key is only part of its identity: the files its probe ran are
    checked against the manifest stored with the answer (:func:`cached_answer`)."""
    identity = source.identity()
    if identity is None:
        return None
    parts = {
        "question": dict(question),
        "source": identity,
        "device": device_identity(),
        "jax": jax_version(),
        "jaxfit": jaxfit_version(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cached_answer(
    options: FitOptions,
    question: Mapping[str, Any],
    source: Source,
    start: float,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> tuple[str | None, FitResult | None]:
    """``(key, result)``: the question's key, and its stored result when there is one whose proven
    program is still stored and whole (otherwise the fit runs again, to pin one); a result that
    has no program to load (a what-if cell, a mocked topology) is reused as it is.

    A script's answer is reused only when the files its probe ran are unchanged (the manifest
    stored with it, :func:`jaxfit._probe.jaxfit_manifest.check`); otherwise ``progress`` hears a
    ``note`` saying what changed, and the script is probed again (its answer replaces this one).
    """
    budget_mod.check_pool_environment()  # before any answer, stored or compiled
    key = answer_key(question, source)
    path = options.cache_file()
    if key is None or path is None:
        return key, None
    store = AnswerCache(path)
    try:
        hit = store.get(key)
    finally:
        store.close()
    wants_pin = options.pin and (hit or {}).get("device", {}).get("topology") != "mock"
    if hit is None or (wants_pin and find_pin(key) is None):
        return key, None
    if isinstance(source, ScriptSource):
        changed = check_manifest(hit.get("manifest") or {})
        if changed is not None:
            if progress is not None:
                progress("note", {"text": f"probing the script again: {changed} since the cached answer"})
            return key, None
    result = FitResult.from_dict(hit)
    return key, dataclasses.replace(result, cached=True, wall_seconds=round(time.perf_counter() - start, 3))


def store_answer(
    options: FitOptions,
    key: str | None,
    result: FitResult,
    *,
    source: Source | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> None:
    """Keep ``result`` under ``key`` (nothing without a key or a usable cache), a script's with the
    ``manifest`` of the files its probe ran (a script's answer without one is not kept: it could
    not be checked)."""
    path = options.cache_file()
    if key is None or path is None:
        return
    value = result.to_dict()
    if isinstance(source, ScriptSource):
        if not manifest:
            return
        value["manifest"] = dict(manifest)
    store = AnswerCache(path)
    try:
        store.put(key, value)
    finally:
        store.close()
