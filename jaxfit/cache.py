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

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from jaxfit._probe.jaxfit_compile_server import CompileCache

__all__ = ["AnswerCache", "CompileCache", "default_cache_path"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, result TEXT NOT NULL, created REAL NOT NULL);
"""


def default_cache_path() -> Path:
    """``$JAXFIT_CACHE_DIR/cache.sqlite3``, else ``~/.cache/jaxfit/cache.sqlite3``."""
    root = os.environ.get("JAXFIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jaxfit"
    )
    return Path(root) / "cache.sqlite3"


class AnswerCache:
    """Whole fit results in SQLite, keyed by the question asked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        with self._lock, self._db:
            self._db.executescript(SCHEMA)

    def get(self, key: str) -> dict[str, Any] | None:
        """The result stored under ``key``, or ``None``."""
        with self._lock:
            row = self._db.execute("SELECT result FROM answers WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, result: dict[str, Any]) -> None:
        """Store one result (one transaction)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO answers (key, result, created) VALUES (?, ?, ?)",
                (key, json.dumps(result), time.time()),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
