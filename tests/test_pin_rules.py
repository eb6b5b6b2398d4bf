"""The pin's own decisions, as pure logic (fast tier): a program compiled again for a pin is held
to the proof's rule, peak plus the loop's next batch within the budget."""

from __future__ import annotations

from jaxfit.fit.memory import MemoryReport
from jaxfit.fit.pin import recompiled_verdict

MiB = 1 << 20


def _report(peak_mib: int, next_mib: int = 0) -> MemoryReport:
    # argument 10 MiB, nothing aliased: the rest of the peak is temp
    return MemoryReport(10 * MiB, 0, 0, (peak_mib - 10) * MiB, next_input_bytes=next_mib * MiB)


def test_a_recompiled_program_with_the_proven_peak_needs_no_word():
    assert recompiled_verdict(_report(90), _report(90, next_mib=8), budget_bytes=100 * MiB) == (None, None)


def test_a_recompiled_program_whose_peak_fits_but_not_with_the_next_batch_is_not_pinned():
    # proven: 90 + 8 <= 100; written again: 95, and 95 + 8 > 100 although 95 alone fits
    refusal, note = recompiled_verdict(_report(95), _report(90, next_mib=8), budget_bytes=100 * MiB)
    assert note is None
    assert refusal is not None and "not pinned" in refusal
    assert "95.00 MiB + 8.00 MiB for the next batch" in refusal and "--no-cache" in refusal


def test_a_recompiled_program_that_still_fits_with_the_next_batch_is_pinned_with_a_note():
    refusal, note = recompiled_verdict(_report(91), _report(90, next_mib=8), budget_bytes=100 * MiB)
    assert refusal is None
    assert note is not None and "91.00 MiB + 8.00 MiB for the next batch" in note and "within the budget" in note


def test_off_a_gpu_there_is_no_next_batch_and_the_peak_alone_decides():
    assert recompiled_verdict(_report(99), _report(90), budget_bytes=100 * MiB)[0] is None
    assert recompiled_verdict(_report(101), _report(90), budget_bytes=100 * MiB)[0] is not None
