"""Turns on the GPU for compile children side by side: many autotune at once, one times alone.

Autotuning runs candidate kernels on the GPU, and a timing runs the proven program there: a timing
beside another child's autotuning (or another timing) measures the contention, not the program.
``jaxfit tune --script --measure inline --parallel N`` proves in N probes at once and times each
proof in its probe, so the probes take turns through :data:`GPU_TURNS`: autotuned compiles share
the GPU with each other, a timing waits until none is running and holds the GPU alone, and once a
timing waits no new autotuned compile starts (a timing is a few seconds; compiles, tens).

Only the children of one jaxfit process take turns; untuned compiles (no kernel runs) never wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Turns:
    """A shared/exclusive lock that prefers its exclusive side (a waiting timing goes next)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def autotuning(self) -> Iterator[None]:
        """Held while a child autotunes: any number at once, none beside a timing."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Held while a child times a program: alone on the GPU."""
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


GPU_TURNS = Turns()
"""The turns of every compile child of this process (:class:`jaxfit.fit.compiler.CompileChild`)."""
