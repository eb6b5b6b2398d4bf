"""The compile server's rounds, in process: real JAX lowering and compiles on the CPU."""

from __future__ import annotations

import io
import json
import threading
import time

import jax
import jax.numpy as jnp

from jaxfit._probe.jaxfit_compile_server import Server, set_persistent_cache


def test_a_rounds_first_batch_compiles_while_the_next_ones_are_traced() -> None:
    """openpi's step takes 2-4 s a batch to trace; a round of eight traced every batch before the
    first compile began (about 20 s of an H100's round). Each batch now goes to its compile as
    soon as it is traced: batch 1's compile starts before batch 3 is traced."""
    events: list[tuple[str, int, float]] = []
    lock = threading.Lock()

    def note(what: str, batch: int) -> None:
        with lock:
            events.append((what, batch, time.perf_counter()))

    def step(x):
        return jnp.tanh(x @ x.T).sum()

    def lower(batch: int):
        note("trace", batch)
        time.sleep(0.5)  # a slow trace
        return jax.jit(step).lower(jax.ShapeDtypeStruct((batch, 8), jnp.float32))

    class Recording(Server):
        def _compile(self, batch, lowered, options, beside):
            note("compile", batch)
            return super()._compile(batch, lowered, options, beside)

    replies = io.StringIO()
    was = set_persistent_cache(False)  # as the server sets it for its own process: restored after
    try:
        server = Recording(lower, replies, {"name": "tanh"})
        server.compile_many({"id": 1, "batches": [1, 2, 3], "autotune": True})
    finally:
        set_persistent_cache(bool(was))

    answers = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert sorted(a["batch"] for a in answers if a["op"] == "result") == [1, 2, 3]
    assert all(a["ok"] for a in answers if a["op"] == "result") and answers[-1]["op"] == "done"
    first_compile = next(t for what, b, t in events if what == "compile" and b == 1)
    last_trace = next(t for what, b, t in events if what == "trace" and b == 3)
    assert first_compile < last_trace, events
