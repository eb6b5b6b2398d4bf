"""fit on the CPU with real compiles: exact boundaries, the inverse, the cache, progress."""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest
from helpers import REPO, error_line

import jaxfit
from jaxfit.examples import build_workload
from jaxfit.fit.memory import analyse

pytestmark = pytest.mark.slow  # real subprocesses and compiles

MiB = 1 << 20
# mlp-tiny on a pretend 8 MiB device at fraction 0.5: a 4 MiB budget, an answer in the hundreds.
OPTIONS = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=8 * MiB, max_batch=4096)


def peak_in_process(example: str, batch: int) -> int:
    return analyse(build_workload(example).lower(batch).compile()).peak_bytes


def test_fit_batch_returns_the_exact_compiled_boundary():
    events: list[str] = []
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), OPTIONS, progress=lambda e, d: events.append(e))
    assert result.outcome == "boundary"
    assert result.budget_bytes == 4 * MiB
    by_batch = {c.batch_size: c for c in result.candidates}
    assert by_batch[result.batch_size].fits and by_batch[result.batch_size].peak_bytes <= result.budget_bytes
    assert not by_batch[result.batch_size + 1].fits
    # The child's numbers are the compiler's: the same compile in this process agrees.
    assert peak_in_process("mlp-tiny", result.batch_size) == result.peak_bytes
    assert peak_in_process("mlp-tiny", result.batch_size + 1) > result.budget_bytes
    assert result.rounds < 8 and result.compiles == len(result.candidates)
    assert {"start", "round", "compiled", "done"} <= set(events)
    assert result.device["platform"] == "cpu" and result.device["total_bytes"] == 8 * MiB
    d = result.to_dict()
    for key in (
        "batch_size",
        "multiple_of",
        "mem_fraction",
        "budget_bytes",
        "peak_bytes",
        "device",
        "compiles",
        "wall_seconds",
        "candidates",
    ):
        assert key in d
    for key in ("batch_size", "peak_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "fits"):
        assert key in d["candidates"][0]


def test_multiple_of_and_bounds_are_respected():
    options = jaxfit.FitOptions(
        mem_fraction=0.5, device_memory_bytes=8 * MiB, multiple_of=8, min_batch=8, max_batch=4096
    )
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
    assert result.batch_size % 8 == 0
    assert all(c.batch_size % 8 == 0 for c in result.candidates)
    by_batch = {c.batch_size: c for c in result.candidates}
    assert by_batch[result.batch_size].fits and not by_batch[result.batch_size + 8].fits


def test_max_batch_reached_is_reported_not_hidden():
    options = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=8 * MiB, max_batch=16)
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
    assert result.batch_size == 16 and result.outcome == "max"
    assert "--max-batch 16 reached" in result.message


def test_headroom_shrinks_the_budget_and_the_answer():
    base = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), OPTIONS)
    kept = jaxfit.fit_batch(
        jaxfit.example_source("mlp-tiny"), jaxfit.FitOptions(**{**OPTIONS.__dict__, "headroom_bytes": 1 * MiB})
    )
    assert kept.budget_bytes == base.budget_bytes - MiB
    assert kept.batch_size < base.batch_size


def test_inverse_finds_the_smallest_fraction_for_a_batch():
    batch = 200
    result = jaxfit.fit_fraction(jaxfit.example_source("mlp-tiny"), batch, OPTIONS)
    peak = peak_in_process("mlp-tiny", batch)
    assert result.mode == "fraction" and result.peak_bytes == peak
    total = 8 * MiB
    assert peak <= int(total * result.mem_fraction)
    assert peak > int(total * (result.mem_fraction - 0.01))
    assert result.process_overhead_bytes == 0  # not a GPU


def test_second_fit_answers_from_the_cache_in_under_a_second(isolated_cache):
    source = jaxfit.example_source("mlp-tiny")
    first = jaxfit.fit_batch(source, OPTIONS)
    assert not first.cached and (isolated_cache / "cache.sqlite3").exists()
    start = time.perf_counter()
    again = jaxfit.fit_batch(source, OPTIONS)
    assert time.perf_counter() - start < 1.0
    assert again.cached and again.batch_size == first.batch_size and again.candidates == first.candidates
    # A different question (another headroom) misses the answer cache but reuses compiles.
    other = jaxfit.fit_batch(source, jaxfit.FitOptions(**{**OPTIONS.__dict__, "headroom_bytes": 1}))
    assert not other.cached and any(c.cached for c in other.candidates)


def test_no_cache_writes_nothing(isolated_cache):
    jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), jaxfit.FitOptions(**{**OPTIONS.__dict__, "use_cache": False}))
    assert not isolated_cache.exists()


def test_entry_workload_from_a_user_module(monkeypatch):
    from helpers import FIXTURES

    monkeypatch.chdir(FIXTURES)
    result = jaxfit.fit_batch(
        jaxfit.entry_source("user_workloads:make_workload"),
        jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=4 * MiB, max_batch=8192),
    )
    assert result.workload["name"] == "user-mlp" and result.outcome == "boundary"


@pytest.mark.parametrize(
    "factory,error,match",
    [
        ("make_not_a_workload", jaxfit.WorkloadError, "returned dict, not a jaxfit.Workload"),
        ("make_raises", jaxfit.WorkloadError, "the factory raised RuntimeError: dataset not found"),
        ("no_such_function", jaxfit.WorkloadError, "has no function 'no_such_function'"),
        ("make_bad_shapes", jaxfit.CompileError, "for a reason other than memory"),
    ],
)
def test_bad_entries_are_one_line_errors(monkeypatch, factory, error, match):
    from helpers import FIXTURES

    monkeypatch.chdir(FIXTURES)
    with pytest.raises(error, match=match) as info:
        jaxfit.fit_batch(jaxfit.entry_source(f"user_workloads:{factory}"), OPTIONS)
    assert "\n" not in str(info.value)


def test_nothing_fits_says_what_the_smallest_batch_needs():
    tiny = jaxfit.FitOptions(mem_fraction=0.2, device_memory_bytes=1 << 20)  # a 205 KiB budget
    with pytest.raises(jaxfit.DoesNotFitError, match=r"not even batch 1 fits .*about fraction 0\.\d\d of this"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), tiny)
    smaller = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=256 * 1024)  # the step needs more than it all
    with pytest.raises(jaxfit.DoesNotFitError, match=r"more than the whole device \(256.00 KiB\); use a larger"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), smaller)


def test_nothing_fits_from_a_raised_min_batch_says_to_lower_it():
    """A window that starts above the answer (an FSDP fit on two H200s from --min-batch 256 whose
    answer is lower) is not 'shrink the model': smaller batches were never tried."""
    window = jaxfit.FitOptions(mem_fraction=0.9, device_memory_bytes=1 << 20, min_batch=2048, max_batch=4096)
    with pytest.raises(jaxfit.DoesNotFitError, match=r"not even batch 2048 fits .*; lower --min-batch 2048 \(smaller"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), window)


def test_batches_fitting_above_the_answer_are_reported():
    """Non-monotone curves (measured on an H100: an MLP ran at 2252 and at 2468, not at 2253)."""
    from jaxfit.fit.results import Candidate, fitting_above

    def candidate(batch: int, fits: bool, autotuned: bool) -> Candidate:
        return Candidate(batch, 100, 1, 1, 0, 1, fits, 1.0, False, autotuned)

    found = [
        candidate(8, True, False),
        candidate(12, True, True),
        candidate(13, False, True),
        candidate(20, True, True),
        candidate(27, True, False),
        candidate(30, False, True),
    ]
    assert fitting_above(found, 12, tuned_only=True) == [20]  # the untuned 27 proves nothing on a GPU
    assert fitting_above(found, 12, tuned_only=False) == [20, 27]
    assert fitting_above(found, 30, tuned_only=False) == []


def test_an_answer_close_to_the_budget_gets_a_headroom_note():
    from jaxfit.fit.results import near_budget_note

    assert near_budget_note(17_388_497_252, 18_025_021_440) == ""  # 3.5 % spare (the H100 gpt-small answer)
    note = near_budget_note(1_481_311_136, 1_505_755_136)  # 1.6 % spare (the H100 ViT-S answer)
    assert "1.6% of the budget is spare" in note and "--headroom 43.08 MiB" in note


GPU_FLOW = jaxfit.FitOptions(mem_fraction=0.5, max_batch=4096, use_cache=False)
"""mlp-tiny on an emulated 8 MiB GPU (``JAXFIT_EMULATE_GPU_TOTAL``) at fraction 0.5."""


@pytest.fixture(scope="module")
def gpu_flow_fit(tmp_path_factory):
    """The fit of :data:`GPU_FLOW` (no cache) and its progress events, made once for the tests that
    ask about it."""
    events: list[tuple[str, dict]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 * MiB))
        mp.setenv("JAXFIT_CACHE_DIR", str(tmp_path_factory.mktemp("gpu-flow-cache")))
        mp.setenv("JAX_PLATFORMS", "cpu")
        result = jaxfit.fit_batch(
            jaxfit.example_source("mlp-tiny"), GPU_FLOW, progress=lambda e, d: events.append((e, d))
        )
    return result, events


def test_gpu_flow_searches_untuned_and_proves_on_tuned_compiles(monkeypatch, gpu_flow_fit):
    """The GPU flow (untuned search, then autotuned proof two at a time) on real CPU compiles that
    pretend to be an 8 MiB GPU: the CPU compiler ignores the autotuning level, so both curves agree
    and one proof round must settle the untuned answer. On a GPU a batch fits when its peak and the
    loop's next batch (the inputs the step does not donate) fit the budget."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 * MiB))
    options = GPU_FLOW
    result, events = gpu_flow_fit
    assert result.device["limit_sensitive"] and result.budget_bytes == 4 * MiB
    answer = result.batch_size
    tuned = {c.batch_size: c for c in result.candidates if c.autotuned}
    assert peak_in_process("mlp-tiny", answer) == result.peak_bytes == tuned[answer].peak_bytes
    assert tuned[answer].next_input_bytes == answer * (64 * 4 + 4)  # float32 inputs of 64 and an int32 label
    need = {b: (c.peak_bytes or 0) + c.next_input_bytes for b, c in tuned.items()}
    assert need[answer] <= 4 * MiB < need[answer + 1]
    rounds = [d for e, d in events if e == "round"]
    assert rounds[-1]["autotune"] and rounds[-1]["batches"] == [answer, answer + 1]
    assert not any(r["autotune"] for r in rounds[:-1]) and all(len(r["batches"]) <= 4 for r in rounds)
    tuned = sorted(c.batch_size for c in result.candidates if c.autotuned)
    assert tuned == [answer, answer + 1] and result.rounds == len(rounds)
    assert all(c.lower_seconds > 0 for c in result.candidates if not c.autotuned)
    phases = result.phases
    assert (phases["search_rounds"], phases["proof_rounds"]) == (len(rounds) - 1, 1)
    assert phases["lower_seconds"] == pytest.approx(sum(c.lower_seconds for c in result.candidates), abs=0.01)
    assert phases["start_seconds"] + phases["search_seconds"] + phases["proof_seconds"] <= result.wall_seconds

    untuned = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), dataclasses.replace(options, verify=False))
    assert untuned.batch_size == answer and not any(c.autotuned for c in untuned.candidates)


def test_gpu_flow_proves_a_window_of_two_batches_in_one_tuned_round(monkeypatch, gpu_flow_fit):
    """A window no untuned round could narrow (a pinned run's answer and the batch above it, tune's
    exact accumulated batches) is compiled as it will run at once: one round, both autotuned (an
    H200 spent three rounds on 51..52 of openpi's pi0: untuned, then 52 tuned, then 51 tuned)."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 * MiB))
    options = GPU_FLOW
    answer = gpu_flow_fit[0].batch_size
    events: list[tuple[str, dict]] = []
    window = dataclasses.replace(options, min_batch=answer, max_batch=answer + 1)
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), window, progress=lambda e, d: events.append((e, d)))
    rounds = [d for e, d in events if e == "round"]
    assert [(r["autotune"], r["batches"]) for r in rounds] == [(True, [answer, answer + 1])]
    assert result.batch_size == answer and result.rounds == 1 and result.compiles == 2
    exact = dataclasses.replace(options, min_batch=answer, max_batch=answer)
    assert jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), exact).compiles == 1


def test_a_planned_card_starts_the_compile_child_once_under_its_limit(monkeypatch):
    """--device-memory on a larger GPU: the GPU's total is read first (a short JAX process), so the
    compile child starts once, under the fraction of this GPU that gives the card's limit (a
    training script's probe used to run its start-up twice: about a minute for openpi's pi0)."""
    from jaxfit.fit.compiler import CompileChild

    fractions: list[float] = []
    start = CompileChild.start

    def counted(self):  # the real start, counted
        fractions.append(self.mem_fraction)
        return start(self)

    monkeypatch.setattr(CompileChild, "start", counted)
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(64 * MiB))  # a 64 MiB GPU plans a 16 MiB card
    options = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=16 * MiB, max_batch=4096, use_cache=False)
    planned = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
    assert fractions == [0.125]  # 0.5 x 16 MiB of 64 MiB, one start
    assert planned.limit_bytes == 8 * MiB and planned.device["gpu_total_bytes"] == 64 * MiB
    assert planned.process_fraction == 0.125

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(16 * MiB))  # the card itself gives the same answer
    itself = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), dataclasses.replace(options, device_memory_bytes=None))
    assert (itself.batch_size, itself.peak_bytes, itself.limit_bytes) == (
        planned.batch_size,
        planned.peak_bytes,
        planned.limit_bytes,
    )


def test_a_fraction_the_compile_process_does_not_take_is_one_error_before_any_compile(monkeypatch, run_cli):
    """Every answer assumes the fraction is a hard cap: a compile process whose allocator limit is
    not that share of the GPU (here an emulated jax that takes 0.75 whatever the variable says, as a
    growing pool or an unread spelling would) stops the fit with one line, before anything compiles."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 << 30))
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_POOL", "0.75")
    events: list[str] = []
    options = jaxfit.FitOptions(mem_fraction=0.5, max_batch=64, use_cache=False)
    with pytest.raises(jaxfit.ConfigError, match=r"GPU memory limit is 6.00 GiB, not 0.5 of this GPU's 8.00 GiB"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options, progress=lambda e, d: events.append(e))
    assert "round" not in events and "compiled" not in events
    proc = run_cli("fit", "--example", "mlp-tiny", "--mem-fraction", "0.5")
    assert proc.returncode == 2 and error_line(proc).startswith("jaxfit: error: the compile process's GPU memory limit")
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_POOL", "0.5")  # the same share: the fit goes on
    assert jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options).limit_bytes == 4 << 30


def test_an_allocator_without_a_limit_is_refused_even_for_a_stored_answer(monkeypatch, tmp_path):
    """XLA_PYTHON_CLIENT_ALLOCATOR=platform makes no fraction a cap (on an H100 one process took the
    whole card): no answer is given under it, not even one the cache holds, where no compile
    process would have shown the missing limit (found on the H100: a cached fit answered)."""
    monkeypatch.setenv("JAXFIT_CACHE_DIR", str(tmp_path))
    options = jaxfit.FitOptions(mem_fraction=0.5, max_batch=8)
    stored = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    with pytest.raises(jaxfit.ConfigError, match="XLA_PYTHON_CLIENT_ALLOCATOR=platform gives JAX an allocator without"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR")
    assert jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options).batch_size == stored.batch_size


def test_gpu_flow_nothing_fits_is_proved_tuned(monkeypatch):
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(256 * 1024))
    options = jaxfit.FitOptions(mem_fraction=0.5, use_cache=False)
    with pytest.raises(jaxfit.DoesNotFitError, match=r"not even batch 1 fits"):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)


def test_gpu_flow_finds_the_smallest_fraction_on_compiles_under_each_fraction(monkeypatch):
    """The GPU flow of ``fit_fraction`` (a child per fraction, aimed then bisecting) on real CPU
    compiles that pretend to be an 8 MiB GPU: the answer is the smallest hundredth whose limit holds
    the peak, which the CPU compiler does not change with the limit."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 * MiB))
    events: list[tuple[str, dict]] = []
    options = jaxfit.FitOptions(use_cache=False)
    result = jaxfit.fit_fraction(
        jaxfit.example_source("mlp-tiny"), 64, options, progress=lambda e, d: events.append((e, d))
    )
    peak = peak_in_process("mlp-tiny", 64)
    assert result.device["limit_sensitive"] and result.peak_bytes == peak
    smallest = next(u for u in range(1, 101) if peak <= int(8 * MiB * u / 100))
    assert round(result.mem_fraction * 100) == smallest
    assert result.rounds == len([e for e, _ in events if e == "round"]) <= 4


def test_a_search_of_listed_batches_compiles_only_them_and_answers_the_largest_that_fits():
    """``jaxfit tune`` asks only about the divisors of its global batch (the only micro-batches it can
    use): under a 400 MB budget gpt-tiny's plain step fits up to about 11 (8: 297.8 MB, 16: 532.9
    MB), and the listed search answers 8 having compiled listed batches alone, in two rounds of four."""
    listed = (1, 2, 4, 8, 16, 32, 64)
    options = jaxfit.FitOptions(
        mem_fraction=0.5, device_memory_bytes=800_000_000, max_batch=64, width=4, use_cache=False, batches=listed
    )
    result = jaxfit.fit_batch(jaxfit.example_source("gpt-tiny", {"n_layers": "1"}), options)
    assert result.batch_size == 8 and result.outcome == "boundary"
    assert {c.batch_size for c in result.candidates} <= set(listed)
    assert result.rounds <= 2 and "batch 16 needs" in result.message, result.message


@pytest.mark.parametrize("preallocate", [True, False])
def test_a_shared_compile_process_that_will_run_what_it_proves_holds_its_whole_pool(preallocate, monkeypatch):
    """A compile process that times the programs it proves (jaxfit tune --measure inline) takes its
    pool at start, as the training process does; one that only compiles lets it grow from nothing.
    (A CPU has no pool: the variable each child starts with is what is checked.)"""
    from helpers import process_environ

    from jaxfit.fit import children

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a user's setting does not decide it
    options = jaxfit.FitOptions(mem_fraction=0.5, max_batch=4, use_cache=False)
    with children.shared_compile_process(preallocate=preallocate):
        jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), options)
        (child,) = children._SHARED.get().values()
        environ = process_environ(str(child._proc.pid))
    assert f"XLA_PYTHON_CLIENT_PREALLOCATE={'true' if preallocate else 'false'} " in environ + " "


@pytest.mark.parametrize("preallocate", [True, False])
def test_a_scripts_probe_that_will_time_what_it_proves_holds_its_whole_pool(preallocate, tmp_path, monkeypatch):
    """A script's probe is its own process, not a shared one, and a tune timing inline runs the
    proven program in it: it takes its pool at start too (on an H200 a probe whose pool grew could
    not hold a program that fit, benchmarks/JOURNAL.md section 27). The script records the variable."""
    from jaxfit.fit import children

    record = tmp_path / "preallocate.txt"
    record.write_text("")  # there before the probe: jaxfit removes the files a probe's start-up creates
    wrapper = tmp_path / "wrapper.py"
    mini = REPO / "tests" / "fixtures" / "mini_train.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "if '--help' not in sys.argv:  # the compile child, not the check of its --help\n"
        f"    open({str(record)!r}, 'a').write(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', 'unset') + '\\n')\n"
        f"sys.argv = [{str(mini)!r}] + sys.argv[1:]\n"
        f"runpy.run_path({str(mini)!r}, run_name='__main__')\n"
    )
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    options = jaxfit.FitOptions(mem_fraction=0.5, max_batch=4, use_cache=False, width=1)
    source = jaxfit.script_source([sys.executable, str(wrapper), "--steps", "1", "--width", "8"])
    with children.shared_compile_process(preallocate=preallocate):
        jaxfit.fit_batch(source, options)
    assert record.read_text().split() == ["true" if preallocate else "false"]


def test_gpu_flow_compiles_again_alone_a_batch_that_ran_out_of_memory_beside_another(monkeypatch, gpu_flow_fit):
    """An H200 compiled openpi's pi0-FAST at 133 and 134 autotuned in one round; 134 ran out of
    memory while autotuning (its untuned peak did not), and the training process's own compile of
    134 then ran 3 steps. A batch that runs out of memory while compiling beside another is
    compiled again alone before it counts as not fitting (the GPU's shared autotuning scratch is
    emulated: an autotuned compile with a smaller batch beside it fails as XLA's out of memory)."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 * MiB))
    options = GPU_FLOW
    answer = gpu_flow_fit[0].batch_size
    monkeypatch.setenv("JAXFIT_EMULATE_CROWDED_COMPILE_OOM", "1")
    events: list[tuple[str, dict]] = []
    window = dataclasses.replace(options, min_batch=answer - 1, max_batch=answer)
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), window, progress=lambda e, d: events.append((e, d)))
    rounds = [d["batches"] for e, d in events if e == "round"]
    assert rounds == [[answer - 1, answer]]  # one tuned round of both, then `answer` alone
    assert [d["batch"] for e, d in events if e == "alone"] == [answer]
    assert result.batch_size == answer and result.compiles == 3
    crowded = [c for c in result.candidates if c.batch_size == answer]
    assert len(crowded) == 2 and sorted(c.fits for c in crowded) == [False, True]

    # a batch over the budget still does not fit when compiled alone, and the answer stays below it
    above = dataclasses.replace(options, min_batch=answer, max_batch=answer + 1)
    events.clear()
    result = jaxfit.fit_batch(jaxfit.example_source("mlp-tiny"), above, progress=lambda e, d: events.append((e, d)))
    assert [d["batch"] for e, d in events if e == "alone"] == [answer + 1]
    assert result.batch_size == answer
