"""Gradient accumulation: choices, retries and command lines (pure logic; the fit is in test_run)."""

from __future__ import annotations

import pytest

from jaxfit.run.accumulation import accumulated_command, accumulation_choices, next_accumulation, with_steps


@pytest.mark.parametrize(
    "global_batch,micro_limit,expected",
    [
        (32, 8, [4, 8, 16, 32]),  # micro-batches of 8, 4, 2, 1
        (32, 32, [1, 2, 4, 8, 16, 32]),
        (32, 100, [1, 2, 4, 8, 16, 32]),
        (12, 5, [3, 4, 6, 12]),  # 4, 3, 2, 1: only divisors of 12
        (7, 3, [7]),  # a prime global batch: only micro-batches of 1
        (32, 0, []),
    ],
)
def test_accumulation_choices_split_evenly_fewest_steps_first(global_batch, micro_limit, expected):
    choices = accumulation_choices(global_batch, micro_limit)
    assert choices == expected
    assert all(global_batch % a == 0 and global_batch // a <= micro_limit for a in choices)


@pytest.mark.parametrize("global_batch,steps,expected", [(32, 1, 2), (32, 2, 4), (12, 4, 6), (7, 1, 7), (32, 32, None)])
def test_next_accumulation_is_the_next_divisor(global_batch, steps, expected):
    assert next_accumulation(global_batch, steps) == expected


def test_with_steps_sets_accumulation_only_when_needed_or_present():
    assert with_steps(["t.py"], 32, 1) == ("t.py", "--batch-size=32")
    assert with_steps(["t.py"], 32, 4) == ("t.py", "--batch-size=32", "--grad-accum-steps=4")
    assert with_steps(["t.py", "--grad-accum-steps=2"], 32, 1) == ("t.py", "--grad-accum-steps=1", "--batch-size=32")
    assert with_steps(["t.py"], 32, 4, "--bs", "--accum") == ("t.py", "--bs=32", "--accum=4")


def test_accumulated_command_always_names_the_steps():
    assert accumulated_command(["t.py", "--batch-size=8"], 32, 1) == ["t.py", "--batch-size=32", "--grad-accum-steps=1"]
    assert accumulated_command(["t.py"], 32, 4, accum_flag="--accum") == ["t.py", "--batch-size=32", "--accum=4"]
