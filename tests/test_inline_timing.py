"""The compile server's timing of a proven program in its own process (``jaxfit tune --measure
inline``): real arguments of the abstract shapes, and the donated state fed back between calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxfit._probe.jaxfit_compile_server import _fed_back, real_arguments


def test_real_arguments_have_the_shapes_dtypes_and_kinds_asked_for():
    abstract = (
        {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)},
        jax.ShapeDtypeStruct((2,), jnp.bfloat16),
        jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
        7,  # a concrete leaf is kept
    )
    state, x, key, seven = real_arguments(abstract)
    assert state["w"].shape == (4, 3) and state["w"].dtype == jnp.float32 and float(jnp.std(state["w"])) > 0
    assert state["step"].dtype == jnp.int32 and int(state["step"]) == 0
    assert x.dtype == jnp.bfloat16 and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and seven == 7


def test_the_donated_state_is_fed_back_from_the_output_that_has_its_shapes():
    state = {"w": jnp.ones((3,)), "n": jnp.zeros((), jnp.int32)}
    batch = jnp.ones((5, 3))
    new_state = {"w": jnp.full((3,), 2.0), "n": jnp.ones((), jnp.int32)}
    metrics = {"loss": jnp.float32(1.0)}
    fed = _fed_back([state, batch], (metrics, new_state), donated=(0,))
    assert fed is not None and fed[0] is new_state and fed[1] is batch
    assert _fed_back([state, batch], (metrics,), donated=(0,)) is None  # no output holds the state
    assert _fed_back([state, batch], metrics, donated=()) == [state, batch]


def test_a_step_the_compile_process_cannot_hold_is_timed_again_after_it_lets_go_of_everything_else():
    """On an H100 the compile process ran out of memory timing a program proved to fit, after a
    dozen other compiles (benchmarks/README.md section 15). The server then drops every other kept
    program and jax's caches and times it once more on freshly placed arguments. A CPU has no pool
    to run out of, so the first placement of the arguments fails as the H100's did."""
    import io

    from jaxfit._probe.jaxfit_compile_server import Server

    def lower(batch):
        return jax.jit(lambda w, x: (w * 0.5, jnp.sum(x @ w))).lower(
            jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((batch, 8), jnp.float32)
        )

    failures = [RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB")]

    def concrete(batch):
        if failures:
            raise failures.pop()
        return real_arguments(
            (jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((batch, 8), jnp.float32))
        )

    server = Server(lower, io.StringIO(), {}, concrete=concrete, donated=(0,))
    for batch in (2, 4):
        assert server.compile_one(batch, autotune=True)["ok"]
    reply = server.time_step(4, warmup=1, steps=2)
    assert reply["ok"] and reply["retried"] and len(reply["step_seconds"]) == 2
    assert list(server._kept) == [4]  # the other program was let go; the timed one is kept for its pin
    plain = server.time_step(4, warmup=1, steps=2)
    assert plain["ok"] and "retried" not in plain
