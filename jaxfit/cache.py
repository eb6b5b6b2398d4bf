"""A SQLite cache, so the same question answers instantly the second time.

Two tables in one file:

- ``compiles``: one compile's memory analysis, keyed by the lowered program's fingerprint, the
  limit the compiler saw, the jax version, the device kind and the compile options. Written by the
  compile child (:class:`CompileCache` lives with the compile server, which must run without
  jaxfit installed); always safe, since the key is the program itself.
- ``answers``: a whole fit's result, keyed by the question (workload identity, fraction, bounds,
  headroom, device, versions). Read by the parent without starting a child, which is what makes a
  repeat answer in well under a second.

Each write is one transaction: a crash leaves the previous state, never half a row.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxfit._probe.jaxfit_compile_server import CompileCache, JsonStore

__all__ = ["AnswerCache", "CompileCache", "JsonStore", "default_cache_path"]


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
