"""Tests of packing runs onto GPUs by need (pure logic: hand-worked cases and random invariants)."""

from __future__ import annotations

import json
import math
import random

import pytest

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import GiB, MiB, fraction_for_bytes
from jaxfit.schedule.packing import GPU, ROW_HEADERS, Need, Plan, plan

OVERHEAD = 618 * MiB
H200_TOTAL = 143_160 * MiB  # CUDA total of an H200 (docs/guides/facts.md #4)
RTX_96 = 96 * GiB


def _live_sets(result: Plan, gpu: int) -> list[list[str]]:
    """The live sets the plan checked on ``gpu``: after each placement, the placed runs not in its ``after``."""
    placed: list[str] = []
    sets = []
    for p in result.placements:
        if p.gpu != gpu:
            continue
        placed.append(p.name)
        sets.append([name for name in placed if name not in p.after])
    return sets


def _needs_of(result: Plan) -> dict[str, int]:
    return {p.name: p.need_bytes for p in result.placements}


# ---------------------------------------------------------------------------------------------
# Hand-worked cases.


def test_three_30gb_runs_share_a_96gb_card() -> None:
    # 30 GiB peak on 96 GiB: fraction ceil(0.3125, 0.01) = 0.32 -> pool 30.72 GiB, + 618 MiB each:
    # 3 x 31.32 GiB = 93.97 GiB <= 96 - 2 = 94 GiB.
    result = plan([Need(f"r{i}", 30 * GiB) for i in range(3)], [GPU(0, RTX_96)], 2 * GiB, OVERHEAD)
    assert [p.after for p in result.placements] == [(), (), ()]
    assert result.waves == 1
    for p in result.placements:
        assert p.mem_fraction == 0.32
        assert p.pool_bytes == math.ceil(0.32 * RTX_96)
        assert p.need_bytes == p.pool_bytes + OVERHEAD
        assert p.peak_bytes == 30 * GiB
    gpu = result.gpu(0)
    assert gpu.planned_bytes == gpu.initial_bytes == 3 * (math.ceil(0.32 * RTX_96) + OVERHEAD)
    assert gpu.planned_bytes <= gpu.capacity_bytes == 94 * GiB


def test_a_fourth_30gb_run_waits() -> None:
    result = plan([Need(f"r{i}", 30 * GiB) for i in range(4)], [GPU(0, RTX_96)], 2 * GiB, OVERHEAD)
    by_name = {p.name: p for p in result.placements}
    assert [by_name[f"r{i}"].after for i in range(3)] == [(), (), ()]
    fourth = by_name["r3"]
    assert fourth.after == ("r0",) and fourth.wave == 1 and fourth.start == 3 and fourth.gpu == 0
    assert result.waves == 2
    assert result.gpu(0).planned_bytes <= 94 * GiB
    assert result.gpu(0).runs == ("r0", "r1", "r2", "r3")


def test_three_processes_at_033_do_not_fit_an_h200_but_at_032_do() -> None:
    # docs/guides/facts.md #5: 3 x (0.33 x 143,160 + 618) MiB = 143,582 MiB > 143,160 MiB.
    h200 = [GPU(0, H200_TOTAL)]
    at_033 = plan([Need(f"r{i}", fraction=0.33) for i in range(3)], h200, 0, OVERHEAD)
    assert [p.after for p in at_033.placements] == [(), (), ("r0",)]
    at_032 = plan([Need(f"r{i}", fraction=0.32) for i in range(3)], h200, 0, OVERHEAD)
    assert all(p.immediate for p in at_032.placements)
    assert at_032.gpu(0).planned_bytes <= H200_TOTAL
    # The same through fitted peaks that round up to those fractions.
    peak_033 = int(0.325 * H200_TOTAL)
    peak_032 = int(0.315 * H200_TOTAL)
    assert fraction_for_bytes(peak_033, H200_TOTAL) == 0.33 and fraction_for_bytes(peak_032, H200_TOTAL) == 0.32
    assert not plan([Need(f"r{i}", peak_033) for i in range(3)], h200, 0, OVERHEAD).placements[2].immediate
    assert plan([Need(f"r{i}", peak_032) for i in range(3)], h200, 0, OVERHEAD).placements[2].immediate


def test_without_overhead_three_at_033_fit() -> None:
    """The overhead is what breaks 3 x 0.33: without it they fit (0.99 of the card)."""
    result = plan([Need(f"r{i}", fraction=0.33) for i in range(3)], [GPU(0, H200_TOTAL)], 0, 0)
    assert all(p.immediate for p in result.placements)


def test_best_fit_decreasing_places_the_big_run_first_on_the_tighter_gpu() -> None:
    gpus = [GPU(0, 96 * GiB), GPU(1, 48 * GiB)]
    result = plan([Need("small", 10 * GiB), Need("big", 40 * GiB)], gpus, 0, OVERHEAD)
    big, small = result.placements
    assert (big.name, big.start, big.gpu) == ("big", 0, 1)  # 48 GiB card: 7 GiB left vs 55 GiB
    assert big.mem_fraction == fraction_for_bytes(40 * GiB, 48 * GiB) == 0.84
    assert (small.name, small.start, small.gpu) == ("small", 1, 0)  # no room left on GPU 1
    assert small.mem_fraction == fraction_for_bytes(10 * GiB, 96 * GiB)
    assert all(p.immediate for p in result.placements)


def test_best_fit_fills_the_fullest_gpu_that_still_holds_the_run() -> None:
    gpus = [GPU(0, 80 * GiB), GPU(1, 80 * GiB)]
    needs = [Need("a", 50 * GiB), Need("b", 40 * GiB), Need("c", 20 * GiB)]
    result = plan(needs, gpus, 0, OVERHEAD)
    where = {p.name: p.gpu for p in result.placements}
    # a -> GPU 0 (tie, lowest index); b does not fit next to a -> GPU 1; c fits both, and GPU 0
    # (80 - 50.4 - 0.6 = 29 GiB free) is tighter than GPU 1 (39 GiB free).
    assert where == {"a": 0, "b": 1, "c": 0}
    assert all(p.immediate for p in result.placements)


def test_priority_comes_before_size() -> None:
    needs = [Need("big-low", 60 * GiB, priority=0), Need("small-high", 40 * GiB, priority=5)]
    result = plan(needs, [GPU(0, RTX_96)], 0, OVERHEAD)
    first, second = result.placements
    assert (first.name, first.immediate) == ("small-high", True)
    assert (second.name, second.after) == ("big-low", ("small-high",))


def test_priority_order_is_the_start_order_and_ties_keep_input_order() -> None:
    needs = [
        Need("a", 10 * GiB, priority=1),
        Need("b", 10 * GiB, priority=3),
        Need("c", 10 * GiB, priority=3),
        Need("d", 20 * GiB, priority=1),
    ]
    result = plan(needs, [GPU(0, RTX_96)], 0, OVERHEAD)
    assert [p.name for p in result.placements] == ["b", "c", "d", "a"]
    assert [p.start for p in result.placements] == [0, 1, 2, 3]


def test_a_lower_priority_run_never_starts_before_a_higher_one_on_the_same_gpu() -> None:
    needs = [Need(f"hi{i}", 40 * GiB, priority=2) for i in range(3)] + [Need("lo", 5 * GiB, priority=0)]
    result = plan(needs, [GPU(0, RTX_96)], 0, OVERHEAD)
    hi2, lo = result.placement("hi2"), result.placement("lo")
    assert hi2.after == ("hi0",)
    assert set(hi2.after) <= set(lo.after)  # lo starts no earlier than hi2
    assert lo.start > hi2.start


def test_a_small_low_priority_run_backfills_another_gpu() -> None:
    gpus = [GPU(0, 48 * GiB), GPU(1, 16 * GiB)]
    needs = [Need("hi0", 40 * GiB, priority=1), Need("hi1", 40 * GiB, priority=1), Need("lo", 8 * GiB)]
    result = plan(needs, gpus, 0, OVERHEAD)
    assert result.placement("hi1").after == ("hi0",)
    lo = result.placement("lo")
    assert lo.gpu == 1 and lo.immediate  # GPU 1 was free and too small for the big runs


def test_a_waiting_run_takes_the_gpu_where_it_waits_for_fewest_runs() -> None:
    gpus = [GPU(0, 64 * GiB), GPU(1, 64 * GiB)]
    needs = [Need("a", 50 * GiB, priority=2)] + [Need(f"x{i}", 15 * GiB, priority=1) for i in range(3)]
    needs.append(Need("w", 40 * GiB, priority=0))
    result = plan(needs, gpus, 0, OVERHEAD)
    assert result.placement("a").gpu == 0
    assert all(result.placement(f"x{i}").gpu == 1 and result.placement(f"x{i}").immediate for i in range(3))
    # w (40.92 GiB) would wait for two runs on GPU 1 (x0, x1) but for one on GPU 0 (a).
    w = result.placement("w")
    assert (w.gpu, w.after, w.wave) == (0, ("a",), 1)


def test_among_equal_waits_a_run_shares_a_gpu_with_the_fewest_runs_then_fills_the_tighter() -> None:
    gpus = [GPU(0, 64 * GiB), GPU(1, 64 * GiB)]
    needs = [Need("a", 50 * GiB), Need("b", 20 * GiB), Need("c", 20 * GiB), Need("d", 20 * GiB), Need("e", 40 * GiB)]
    result = plan(needs, gpus, 0, OVERHEAD)
    # a -> GPU 0, e -> GPU 1 (does not fit next to a), b -> GPU 1 next to e. c fits nowhere now:
    # it waits for one run either way (a on GPU 0, e on GPU 1); on GPU 0 it then runs alone, on
    # GPU 1 next to b: GPU 0. d waits for one run either way and shares with one (c or b), and
    # both GPUs would be left with as much free: the first, GPU 0.
    assert [p.name for p in result.placements] == ["a", "e", "b", "c", "d"]
    assert result.placement("b").gpu == 1 and result.placement("b").immediate
    for name in ("c", "d"):
        p = result.placement(name)
        assert (p.gpu, p.after, p.wave) == (0, ("a",), 1)
    # equal waits and equal sharing: the GPU it fills tighter (the smaller card)
    tight = plan([Need("s", 10 * GiB)], [GPU(0, 64 * GiB), GPU(1, 48 * GiB)], 0, OVERHEAD)
    assert tight.placement("s").gpu == 1


def test_runs_that_fit_side_by_side_are_spread_over_idle_gpus_first() -> None:
    """The queue of benchmarks/JOURNAL.md section 14 on one host of four 80 GiB GPUs: two FSDP-2 runs
    at 0.2 and four one-GPU runs. Best fit alone put all six on GPUs 0 and 1 (the four one-GPU runs
    on GPU 0) and left GPUs 2 and 3 idle; each GPU now gets work before any shares one."""
    gpus = [GPU(i, 81559 * MiB) for i in range(4)]
    needs = [Need("fsdp2-a", fraction=0.2, gpus=2), Need("fsdp2-b", fraction=0.2, gpus=2)]
    needs += [Need(n, fraction=f) for n, f in (("gpt-a", 0.16), ("gpt-b", 0.16), ("vit-a", 0.1), ("vit-b", 0.1))]
    result = plan(needs, gpus, GiB, OVERHEAD)
    assert result.placement("fsdp2-a").gpus == (0, 1) and result.placement("fsdp2-b").gpus == (2, 3)
    runs_per_gpu = [len(g.runs) for g in result.gpus]
    assert runs_per_gpu == [2, 2, 2, 2], runs_per_gpu
    assert all(p.immediate for p in result.placements)


def test_two_gpus_of_different_sizes_use_their_own_fractions() -> None:
    gpus = [GPU(0, H200_TOTAL), GPU(1, RTX_96)]
    needs = [Need(f"r{i}", 40 * GiB) for i in range(5)]
    result = plan(needs, gpus, 2 * GiB, OVERHEAD)
    total = {0: H200_TOTAL, 1: RTX_96}
    for p in result.placements:
        assert p.mem_fraction == fraction_for_bytes(40 * GiB, total[p.gpu])
        assert p.need_bytes == math.ceil(p.mem_fraction * total[p.gpu]) + OVERHEAD
    counts = {g.index: sum(1 for p in result.placements if p.gpu == g.index and p.immediate) for g in result.gpus}
    assert counts == {0: 3, 1: 2}  # 3 x 41.12 on 139.8 GiB; 2 x 40.92 on 94 GiB
    assert sum(1 for p in result.placements if p.immediate) == 5


def test_fixed_fraction_scales_with_the_gpu() -> None:
    result = plan([Need("f", fraction=0.5)], [GPU(3, RTX_96)], 0, OVERHEAD)
    (p,) = result.placements
    assert (p.gpu, p.mem_fraction, p.pool_bytes, p.need_bytes) == (3, 0.5, 48 * GiB, 48 * GiB + OVERHEAD)
    assert p.peak_bytes is None


def test_fixed_fraction_too_small_for_the_peak_skips_that_gpu() -> None:
    gpus = [GPU(0, 48 * GiB), GPU(1, RTX_96)]
    result = plan([Need("f", peak_bytes=30 * GiB, fraction=0.5)], gpus, 0, OVERHEAD)
    assert result.placements[0].gpu == 1  # 0.5 of 48 GiB is 24 GiB < 30 GiB
    with pytest.raises(ConfigError, match="raise its fraction") as err:
        plan([Need("f", peak_bytes=30 * GiB, fraction=0.25)], gpus, 0, OVERHEAD)
    assert "\n" not in str(err.value)


def test_headroom_raises_the_fraction() -> None:
    result = plan([Need("h", 30 * GiB, headroom_bytes=2 * GiB)], [GPU(0, RTX_96)], 0, OVERHEAD)
    assert result.placements[0].mem_fraction == fraction_for_bytes(32 * GiB, RTX_96) == 0.34


def test_a_run_larger_than_any_gpu_is_rejected_with_its_need() -> None:
    with pytest.raises(ConfigError) as err:
        plan([Need("ok", 10 * GiB), Need("huge", 100 * GiB)], [GPU(0, RTX_96)], 2 * GiB, OVERHEAD)
    message = str(err.value)
    assert "\n" not in message
    assert "'huge'" in message and "100.60 GiB" in message  # 100 GiB peak + 618 MiB
    assert "94.00 GiB" in message and "GPU 0" in message


def test_a_run_that_fits_the_card_but_not_the_reserve_is_rejected() -> None:
    # 94.5 GiB peak: fraction 0.99 of 96 GiB = 95.04 GiB pool + 618 MiB > 94 GiB capacity.
    with pytest.raises(ConfigError, match=r"'tight' needs .* but the largest GPU offers 94\.00 GiB"):
        plan([Need("tight", int(94.5 * GiB))], [GPU(0, RTX_96)], 2 * GiB, OVERHEAD)


def test_the_largest_gpu_is_named_in_the_rejection() -> None:
    with pytest.raises(ConfigError, match=r"offers .* \(GPU 7: 139\.80 GiB\)"):
        plan([Need("x", fraction=1.0)], [GPU(2, RTX_96), GPU(7, H200_TOTAL)], 0, OVERHEAD)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"needs": [Need("a", GiB), Need("a", GiB)], "gpus": [GPU(0, RTX_96)]}, "'a' appears twice"),
        ({"needs": [Need("a", GiB)], "gpus": []}, "no GPU"),
        ({"needs": [Need("a", GiB)], "gpus": [GPU(0, RTX_96), GPU(0, RTX_96)]}, "repeat"),
        ({"needs": [Need("a", GiB)], "gpus": [GPU(0, 0)]}, "must be positive"),
        ({"needs": [Need("a", GiB)], "gpus": [GPU(0, RTX_96)], "reserve_bytes": -1}, ">= 0"),
    ],
)
def test_bad_plan_inputs(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        plan(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "neither a peak nor a fraction"),
        ({"peak_bytes": 0}, "positive"),
        ({"fraction": 1.5}, r"\(0, 1\]"),
        ({"fraction": 0.0}, r"\(0, 1\]"),
        ({"peak_bytes": 5, "headroom_bytes": -1}, ">= 0"),
    ],
)
def test_bad_needs(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Need("x", **kwargs)


def test_empty_queue_plans_nothing() -> None:
    result = plan([], [GPU(0, RTX_96)], 0, OVERHEAD)
    assert result.placements == () and result.waves == 1 and result.gpu(0).planned_bytes == 0


def test_to_dict_and_rows() -> None:
    result = plan([Need(f"r{i}", 30 * GiB, priority=i % 2) for i in range(4)], [GPU(0, RTX_96)], 2 * GiB, OVERHEAD)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["reserve_bytes"] == 2 * GiB and data["overhead_bytes"] == OVERHEAD and data["waves"] == 2
    assert [p["name"] for p in data["placements"]] == [p.name for p in result.placements]
    assert set(data["placements"][0]) == {
        "name",
        "gpu",
        "mem_fraction",
        "peak_bytes",
        "pool_bytes",
        "need_bytes",
        "priority",
        "start",
        "wave",
        "after",
        "gpus",
    }
    assert data["gpus"][0]["capacity_bytes"] == 94 * GiB
    assert data["gpus"][0]["free_bytes"] == 94 * GiB - data["gpus"][0]["planned_bytes"]
    rows = result.rows()
    assert len(rows) == 4 and all(len(r) == len(ROW_HEADERS) for r in rows)
    assert rows[0][:4] == ("0", "r1", "0", "0.32") and rows[0][-1] == "now"
    assert rows[-1][-1].startswith("after ")


# ---------------------------------------------------------------------------------------------
# Random cases: the plan never overfills a GPU, whatever order the runs really finish in.


def _random_case(rng: random.Random) -> tuple[list[Need], list[GPU], int, int]:
    sizes = [RTX_96, H200_TOTAL, 80 * GiB, 40 * GiB, 24 * GiB]
    gpus = [GPU(i, rng.choice(sizes)) for i in rng.sample(range(8), rng.randint(1, 4))]
    reserve = rng.choice([0, 512 * MiB, 2 * GiB, 5 * GiB])
    overhead = rng.choice([0, OVERHEAD, 1 * GiB])
    needs = []
    for i in range(rng.randint(1, 14)):
        kind = rng.random()
        priority = rng.choice([0, 0, 1, 2])
        if kind < 0.7:
            needs.append(
                Need(
                    f"r{i}",
                    rng.randint(64 * MiB, 90 * GiB),
                    priority=priority,
                    headroom_bytes=rng.choice([0, 0, 512 * MiB]),
                )
            )
        elif kind < 0.9:
            needs.append(Need(f"r{i}", fraction=rng.randint(1, 100) / 100, priority=priority))
        else:
            needs.append(
                Need(f"r{i}", rng.randint(GiB, 30 * GiB), fraction=rng.randint(10, 60) / 100, priority=priority)
            )
    return needs, gpus, reserve, overhead


def _execute(result: Plan, rng: random.Random) -> list[dict[int, int]]:
    """Run the plan with random durations: each run starts once all of its ``after`` finished.

    Returns the memory in use per GPU at every moment something started.
    """
    duration = {p.name: rng.random() for p in result.placements}
    need = _needs_of(result)
    gpu_of = {p.name: p.gpu for p in result.placements}
    finished: set[str] = set()
    live: dict[str, float] = {}  # name -> end time
    pending = list(result.placements)
    now, snapshots = 0.0, []
    while pending or live:
        ready = [p for p in pending if set(p.after) <= finished]
        for p in ready:
            live[p.name] = now + duration[p.name]
            pending.remove(p)
        if ready:
            used: dict[int, int] = {}
            for name in live:
                used[gpu_of[name]] = used.get(gpu_of[name], 0) + need[name]
            snapshots.append(used)
        assert live, "deadlock: runs wait for runs that never start"
        now = min(live.values())
        for name in [n for n, end in live.items() if end == now]:
            finished.add(name)
            del live[name]
    return snapshots


def test_random_plans_never_overfill_a_gpu() -> None:
    rng = random.Random(20240611)
    planned = rejected = waited = 0
    for _ in range(400):
        needs, gpus, reserve, overhead = _random_case(rng)
        try:
            result = plan(needs, gpus, reserve, overhead)
        except ConfigError as err:
            message = str(err)
            assert "\n" not in message
            assert "largest GPU" in message or "raise its fraction" in message
            rejected += 1
            continue
        planned += 1
        waited += result.waves > 1
        capacity = {g.index: g.total_bytes - reserve for g in gpus}
        total = {g.index: g.total_bytes for g in gpus}
        assert sorted(p.name for p in result.placements) == sorted(n.name for n in needs)
        assert [p.start for p in result.placements] == list(range(len(needs)))
        need = _needs_of(result)
        for gpu in result.gpus:
            assert gpu.planned_bytes <= gpu.capacity_bytes == capacity[gpu.index]
            for live in _live_sets(result, gpu.index):
                assert sum(need[name] for name in live) <= capacity[gpu.index]
        for p in result.placements:
            source = next(n for n in needs if n.name == p.name)
            assert p.need_bytes == math.ceil(p.mem_fraction * total[p.gpu]) + overhead
            if source.fraction is None:
                assert p.mem_fraction == fraction_for_bytes(source.peak_bytes + source.headroom_bytes, total[p.gpu])
            assert p.pool_bytes >= (p.peak_bytes or 0) + source.headroom_bytes or source.peak_bytes is None
            assert p.wave == (1 + max(result.placement(a).wave for a in p.after) if p.after else 0)
            assert all(result.placement(a).gpu == p.gpu and result.placement(a).start < p.start for a in p.after)
        # Higher priority never starts later on the same GPU: its after set is contained in the lower's.
        for a in result.placements:
            for b in result.placements:
                if a.gpu == b.gpu and a.priority > b.priority:
                    assert set(a.after) <= set(b.after) and a.start < b.start
        for _trial in range(3):
            for used in _execute(result, rng):
                for index, value in used.items():
                    assert value <= capacity[index]
    assert planned > 200 and rejected > 20 and waited > 100  # the cases exercise every path


def test_a_run_on_two_gpus_is_packed_beside_single_gpu_runs() -> None:
    """``gpus: 2``: the same need on both GPUs, the single-GPU runs fill what is left."""
    needs = [Need("big", 60 * GiB, gpus=2), Need("a", 20 * GiB), Need("b", 20 * GiB), Need("c", 20 * GiB)]
    result = plan(needs, [GPU(0, RTX_96), GPU(1, RTX_96)], 2 * GiB, OVERHEAD)
    big = result.placement("big")
    assert big.gpus == (0, 1) and big.immediate and big.gpu == 0
    assert result.gpu(0).runs[0] == "big" and result.gpu(1).runs[0] == "big"
    singles = [result.placement(n) for n in "abc"]
    assert all(len(p.gpus) == 1 for p in singles)
    # 96 GiB less a 2 GiB reserve: next to the 60 GiB run there is room for one 20 GiB run per GPU.
    assert sorted(p.immediate for p in singles) == [False, True, True]
    for gpu in result.gpus:
        assert gpu.planned_bytes <= gpu.capacity_bytes
    data = json.loads(json.dumps(result.to_dict()))
    assert data["placements"][0]["gpus"] == [0, 1]
    assert Plan.from_dict(data) == result
    assert result.rows()[0][2] == "0,1"


def test_a_two_gpu_run_waits_for_both_gpus() -> None:
    needs = [Need("a", 70 * GiB), Need("b", 70 * GiB), Need("big", 70 * GiB, gpus=2)]
    result = plan(needs, [GPU(0, RTX_96), GPU(1, RTX_96)], 0, OVERHEAD)
    big = result.placement("big")
    assert set(big.after) == {"a", "b"} and big.wave == 1 and big.gpus == (0, 1)


def test_a_run_wanting_more_gpus_than_the_plan_has_is_rejected() -> None:
    with pytest.raises(ConfigError, match="run 'big' takes 4 GPUs but the plan has 2; plan on 4 or more GPUs"):
        plan([Need("big", GiB, gpus=4)], [GPU(0, RTX_96), GPU(1, RTX_96)])
    with pytest.raises(ConfigError, match="only 1 of the plan's GPUs can hold its share"):
        plan([Need("big", 40 * GiB, gpus=2)], [GPU(0, RTX_96), GPU(1, 24 * GiB)])
    with pytest.raises(ConfigError, match="gpus=0 must be at least 1"):
        Need("x", GiB, gpus=0)


def test_cluster_admission_counts_gpus_as_ray_does():
    """Shares are placed per GPU, not summed: two runs of 0.6 need two GPUs, a run on two GPUs takes
    two whole ones (Ray has no fraction of several GPUs)."""
    from jaxfit.schedule.scheduler import fits_gpus

    assert fits_gpus([0.6, 0.6], 2) and not fits_gpus([0.6, 0.6, 0.6], 2)
    assert fits_gpus([0.5, 0.5, 0.4, 0.6], 2) and not fits_gpus([0.5, 0.5, 0.4, 0.7], 2)
    assert fits_gpus([2.0, 0.3], 3) and not fits_gpus([2.0, 0.3, 0.8], 3) and not fits_gpus([2.0], 1)
    assert not fits_gpus([0.1], 0) and fits_gpus([], 0)


def test_a_small_run_asks_ray_for_an_even_split_of_the_free_gpus_while_it_fits() -> None:
    """Ray packs fractional GPU requests onto one GPU of a node; asking for at least 1/k of a GPU,
    when the one-GPU runs spread evenly put k on each GPU, makes it spread them."""
    from jaxfit.schedule.scheduler import fits_gpus, spread_share

    # section 14's moment: one FSDP-2 run holds two of four GPUs, four small runs to start: 0.5 each
    live: list[float] = [2.0]
    asked = []
    for need in (0.16, 0.16, 0.1, 0.1):
        asked.append(spread_share(need, live, one_gpu_runs=4, gpus=4))
        live.append(asked[-1])
    assert asked == [0.5, 0.5, 0.5, 0.5] and fits_gpus(live, 4)
    assert spread_share(0.1, [], one_gpu_runs=2, gpus=2) == 1.0  # one GPU each
    assert spread_share(0.7, [], one_gpu_runs=4, gpus=2) == 0.7  # more than an even split: its need
    assert spread_share(2.0, [], one_gpu_runs=4, gpus=4) == 2.0  # a run on several GPUs: whole GPUs
    # an even split that no longer fits next to the live runs: its need, so it still starts now
    assert spread_share(0.3, [0.6, 0.6], one_gpu_runs=4, gpus=2) == 0.3
