"""Ranking micro-batches on untuned programs before proving any (pure logic)."""

from __future__ import annotations

from jaxfit.tune.ranking import Candidate, Rung, proof_order, untuned_rates


def test_untuned_rates_are_the_global_batch_over_the_median_step_and_failed_timings_give_none():
    timings = [
        {"batch": 16, "ok": True, "step_seconds": [0.5, 0.4, 0.6]},
        {"batch": 8, "ok": True, "step_seconds": [0.2, 0.25, 9.0]},  # the median, not the mean
        {"batch": 4, "ok": False, "error": "RESOURCE_EXHAUSTED", "oom": True},
        {"batch": 2, "ok": True, "step_seconds": []},
    ]
    assert untuned_rates(timings, 64) == {16: 64 / 0.5, 8: 64 / 0.25}


def test_proofs_go_fastest_first_then_the_untimed_largest_first():
    cands = [
        Candidate("a", 8, 100.0),
        Candidate("a", 4, None),
        Candidate("b", 16, 120.0),
        Candidate("b", 2, None),
        Candidate("a", 2, 90.0),
        Candidate("b", 8, None),
    ]
    assert [(c.setting, c.micro_batch) for c in proof_order(cands)] == [
        ("b", 16),
        ("a", 8),
        ("a", 2),
        ("b", 8),
        ("a", 4),
        ("b", 2),
    ]


def test_the_rung_leaves_out_only_what_is_clearly_slower_than_the_best_proved_to_fit():
    rung = Rung(0.1)
    top, close, slow, untimed = (
        Candidate("a", 8, 200.0),
        Candidate("b", 4, 181.0),
        Candidate("a", 2, 179.0),
        Candidate("b", 1, None),
    )
    # nothing is left out before a candidate was proved to fit: the fastest may not fit autotuned
    assert not rung.left_out(slow)
    rung.proved(top)
    assert not rung.left_out(close)  # 9.5 % below
    assert rung.left_out(slow)  # 10.5 % below
    assert not rung.left_out(untimed)  # no evidence: proved
    rung.proved(close)  # the reference stays the fastest proved to fit
    assert rung.reference is top
    assert rung.why(slow) == (
        "untuned it ran at 179.0 samples/s, more than 10% below a at micro-batch 8 (200.0): not proved"
    )


def test_a_fastest_candidate_that_does_not_fit_leaves_the_reference_to_the_next_that_does():
    """none 8 x 8 of gpt-small on an H100 fits untuned and not autotuned: had its rate been the
    reference, the real winner (4 x 16) could have been left out."""
    rung = Rung(0.1)
    order = proof_order([Candidate("none", 8, 230.0), Candidate("none", 4, 197.0), Candidate("full", 8, 189.0)])
    assert order[0].micro_batch == 8
    # 8 is proved and does not fit: no reference yet, so 4 is proved, and becomes it
    assert not rung.left_out(order[1])
    rung.proved(order[1])
    assert not rung.left_out(order[2])  # 4 % below 197
