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


def test_leaves_larger_than_the_noise_block_are_filled_with_noise_and_differ_from_each_other():
    from jaxfit._probe.jaxfit_compile_server import NOISE_BLOCK

    shape = (3, NOISE_BLOCK // 2 + 5)  # 1.5 blocks and a bit
    a, b = real_arguments((jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct(shape, jnp.bfloat16)))
    assert a.shape == shape and b.dtype == jnp.bfloat16
    assert 0.9 < float(jnp.std(a)) < 1.1 and abs(float(jnp.mean(a))) < 0.05
    assert not bool(jnp.array_equal(a.astype(jnp.bfloat16), b))  # each leaf starts elsewhere in the block


def test_a_script_s_step_is_timed_on_the_script_s_own_batch_repeated_to_the_program_s_size(tmp_path):
    """A script's probe times the proven program on the script's own batch, its rows repeated to
    the program's batch size, not on zeros: on an H200 gpt_small's step ran 1.7-1.9 times slower on
    a batch of zero tokens than on the script's own (benchmarks/JOURNAL.md section 35). The fixture's
    step writes the sum and count of the labels it runs on; the script's batch of 4 has labels 0-3."""
    import sys
    from pathlib import Path

    import jaxfit

    record = tmp_path / "labels.txt"
    record.write_text("")  # there before the probe: what a probe creates, jaxfit takes away
    script = Path(__file__).parent / "fixtures" / "mini_train.py"
    command = [sys.executable, str(script), "--batch-size", "4", "--width", "8", "--record-labels", str(record)]
    options = jaxfit.FitOptions(mem_fraction=0.5, min_batch=10, max_batch=10, use_cache=False, time_steps=(1, 2))
    result = jaxfit.fit_batch(jaxfit.script_source(command), options)
    assert result.batch_size == 10 and result.timing is not None and result.timing["ok"]
    # batch 10 from rows 0 1 2 3: 0 1 2 3 0 1 2 3 0 1, summing to 13, in each of the 3 calls (noise: 0)
    assert record.read_text().split("\n")[:-1] == ["13 10"] * 3
