"""One JAX persistent compilation cache for the processes of a script that one command starts.

Every process of a script compiles what the script jits before its train step: on an H200,
scripts/train.py gpt_small's ``init_train_state`` took 21.5 s of its 25 s start-up
(benchmarks/JOURNAL.md section 36), in each probe and each measuring process of a tune alike. With
:func:`shared_compile_cache` those processes share a cache in a temporary folder
(``$JAX_COMPILATION_CACHE_DIR``), so the second one on loads that program instead of compiling it
again. The train step is never served from it: jaxfit's compile server and the pin's own check
compile with the cache off (:func:`jaxfit._probe.jaxfit_compile_server.persistent_cache_off`),
and a measuring process runs the pinned executable. Every process of one command runs under the
same fraction, so what one compiled is what another would. A cache the user set stays theirs:
nothing is changed then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

VARIABLE = "JAX_COMPILATION_CACHE_DIR"

__all__ = ["SharedCache", "shared_compile_cache"]


class SharedCache:
    """The folder of a :func:`shared_compile_cache` block (None: no cache was set up)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder

    def entries(self) -> int | None:
        """Programs in the cache now (None without one): what the processes shared."""
        if self.folder is None:
            return None
        return sum(1 for _root, _dirs, files in os.walk(self.folder) for f in files if not f.startswith("."))


@contextlib.contextmanager
def shared_compile_cache(enabled: bool = True) -> Iterator[SharedCache]:
    """Within the block, the processes started from this one share a JAX compilation cache in a
    temporary folder (removed after); its :class:`SharedCache` has no folder when not ``enabled``
    or when ``$JAX_COMPILATION_CACHE_DIR`` is already set (the user's own cache, left as it is)."""
    if not enabled or os.environ.get(VARIABLE):
        yield SharedCache(None)
        return
    folder = tempfile.mkdtemp(prefix="jaxfit-jax-cache-")
    os.environ[VARIABLE] = folder
    try:
        yield SharedCache(folder)
    finally:
        if os.environ.get(VARIABLE) == folder:
            del os.environ[VARIABLE]
        shutil.rmtree(folder, ignore_errors=True)
