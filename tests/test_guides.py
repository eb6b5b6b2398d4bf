"""Untuned compiles one fit lends the next fit of the same step (jaxfit.fit.guides)."""

from __future__ import annotations

import dataclasses

import pytest

import jaxfit
from jaxfit.fit import guides

MiB = 1 << 20


def test_only_points_far_from_both_budgets_are_lent():
    key = "step"
    with guides.shared_untuned_curves():
        guides.record(key, 100, {10: 50, 20: 89, 30: 95, 40: 130, 50: 200})
        # this budget 200: 10 and 20 needed 10 % or more under both budgets; 30 was within 10 % of its
        # own (it may have been squeezed there); 40 and 50 were over a smaller budget, but only 50 is
        # 10 % over this one
        assert guides.seed(key, 200) == {10: -150.0, 20: -111.0}
        assert guides.seed(key, 180) == {10: -130.0, 20: -91.0, 50: 20.0}
        # a smaller budget: what failed under a larger one may fit here after squeezing, so it is not lent
        guides.record("other", 400, {60: 500})
        assert guides.seed("other", 200) == {}
        assert guides.seed("unknown step", 200) == {}
    assert guides.seed(key, 200) == {}  # nothing is kept outside the context


@pytest.mark.slow  # real compiles
def test_a_fit_after_another_of_the_same_step_searches_in_fewer_untuned_rounds(monkeypatch, isolated_cache):
    """Two cards of a plan on an emulated GPU: the second card's untuned search starts from the
    first card's compiles far from both budgets, and gives the answer, peak and proof the card's
    fit alone gives, in fewer untuned rounds."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(64 * MiB))
    options = jaxfit.FitOptions(mem_fraction=0.5, max_batch=4096, use_cache=False)
    big = dataclasses.replace(options, device_memory_bytes=32 * MiB)
    source = jaxfit.example_source("mlp-tiny")
    alone = jaxfit.fit_batch(source, big)
    notes: list[str] = []
    with guides.shared_untuned_curves():
        jaxfit.fit_batch(source, dataclasses.replace(options, device_memory_bytes=8 * MiB))
        after = jaxfit.fit_batch(source, big, progress=lambda e, d: notes.append(d["text"]) if e == "note" else None)
    assert (after.batch_size, after.peak_bytes, after.outcome) == (alone.batch_size, alone.peak_bytes, alone.outcome)
    tuned = sorted(c.batch_size for c in after.candidates if c.autotuned)
    assert tuned == [after.batch_size, after.batch_size + 1]  # proved here, on both sides
    assert after.phases["search_rounds"] < alone.phases["search_rounds"]
    assert any("an earlier fit of this step compiled far from this budget" in n for n in notes)
