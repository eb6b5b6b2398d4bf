"""A SQLite cache, so the same question answers instantly the second time.

Two tables in one file:

- ``compiles``: one compile's memory analysis, keyed by the lowered program's fingerprint, the
  limit the compiler saw, the jax version, the device kind and the compile options. Written by the
  compile child (:class:`CompileCache` lives with the compile server, which must run without
  jaxfit installed); always safe, since the key is the program itself.
- ``answers``: a whole fit's result, keyed by the question (workload identity, fraction, bounds,
  headroom, device, versions). Read by the parent without starting a child, which is what makes a
  repeat answer in well under a second.

Each write is one transaction: a crash leaves the previous state, never half a row. The cache is
disposable (:func:`usable_cache`): a corrupt file is moved aside and a folder that cannot be written
is bypassed, each with one warning; a fit never fails over its cache.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from jaxfit._probe.jaxfit_compile_server import CompileCache, JsonStore
from jaxfit.errors import warn

__all__ = ["AnswerCache", "CompileCache", "JsonStore", "default_cache_path", "usable_cache"]


def default_cache_path() -> Path:
    """``$JAXFIT_CACHE_DIR/cache.sqlite3``, else ``~/.cache/jaxfit/cache.sqlite3``."""
    root = os.environ.get("JAXFIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jaxfit"
    )
    return Path(root) / "cache.sqlite3"


class AnswerCache(JsonStore):
    """Whole fit results, keyed by the question asked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(str(path), "answers")


def usable_cache(path: str | os.PathLike[str]) -> str | None:
    """``path`` ready to use as the cache file, or None to run without a cache.

    A file that is not a readable SQLite cache is renamed ``<name>.corrupt-<time>`` and a new one
    started; a folder that cannot be written makes jaxfit run without its cache. Either way with one
    warning line, never an error.
    """
    path = Path(path)
    for attempt in range(2):
        try:
            store = AnswerCache(path)
            try:
                store.get("jaxfit-cache-check")
                CompileCache(str(path)).close()
            finally:
                store.close()
            return str(path)
        except sqlite3.DatabaseError as e:
            readonly = isinstance(e, sqlite3.OperationalError)
            if readonly or attempt:
                warn(
                    f"the cache {path} cannot be used ({e}); running without it (set JAXFIT_CACHE_DIR to a "
                    "writable folder)"
                )
                return None
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                path.rename(aside)
            except OSError as err:
                warn(
                    f"the cache {path} is corrupt ({e}) and cannot be moved aside ({err.strerror}); running without it"
                )
                return None
            warn(f"the cache {path} was corrupt ({e}); moved it aside to {aside.name} and started a new one")
        except OSError as e:
            warn(
                f"the cache folder {path.parent} cannot be written ({e.strerror or e}); running without the cache "
                "(set JAXFIT_CACHE_DIR to a writable folder)"
            )
            return None
    return None
