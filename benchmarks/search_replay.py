"""Replay recorded openpi fits through the search: rounds and compiles, no GPU.

Each case is a fit recorded on a GPU (its JSON under benchmarks/results/, or its log for a fit cut
off before it wrote one): its untuned and autotuned peaks at the batches it compiled. Between
recorded batches a peak is interpolated linearly, beyond them extended along the last two; that is
a model of the curve, not a measurement, so this compares search strategies by rounds and compiles
only. The real cost of a round is measured on a GPU (benchmarks/openpi/fit_phases.sh).

    python benchmarks/search_replay.py            # the search as it is, at widths 4 and 8
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import numpy as np

from jaxfit.fit.search import Grid, left_open, prove, search

RESULTS = pathlib.Path(__file__).parent / "results"
CASES = {
    "pi05_libero 80 GiB, H100": "h100/openpi/pi05_libero-80GiB.json",
    "pi0_fast_libero 80 GiB, H100": "h100/openpi/pi0_fast_libero-80GiB.json",
    "pi0 LoRA 48 GiB, H100": "h100/openpi/pi0_libero_low_mem_finetune-48GiB.json",
    "pi0 LoRA 96 GiB, H200": "h200x2/openpi/call4/pi0_libero_low_mem_finetune-96GiB-gpu1-run.json",
    "pi0_libero 141 GB, H200": "h200x2/openpi/call2/pi0_libero-141GB-gpu1-run.json",
    "pi0-FAST LoRA 32 GiB, H200": "h200x4/openpi/call4/pi0_fast_libero_low_mem_finetune-32GiB.json",
    "pi0 LoRA 48 GiB, H100, 2026-12-07 (4 a round)": "h100/openpi-phases/w4/pi0_libero_low_mem_finetune-48GiB.json",
    "pi0 LoRA 48 GiB, H100, 2026-12-07 (8 a round)": "h100/openpi-phases/w8/pi0_libero_low_mem_finetune-48GiB.json",
    # cut off before its last autotuned round (41, 42): no JSON, read from its log
    "pi05_libero 80 GiB, H100, 2026-12-07": "h100/pi05-proof/call1/pi05_libero-80GiB.log",
}


def curve(points: dict[int, float]):
    """Peak at any batch from recorded ones: linear between them, extended along the end pairs."""
    xs = sorted(points)
    ys = [points[x] for x in xs]

    def peak(b: int) -> float:
        if len(xs) == 1:
            return ys[0]
        if b < xs[0]:
            return ys[0] - (xs[0] - b) * (ys[1] - ys[0]) / (xs[1] - xs[0])
        if b > xs[-1]:
            return ys[-1] + (b - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(np.interp(b, xs, ys))

    return peak


def load_log(path: str):
    """A fit's progress log (for a fit cut off before its JSON): the peaks it printed (rounded to
    0.01 GiB), its budget, and ``None`` for the answer it did not reach."""
    untuned: dict[int, float] = {}
    tuned: dict[int, float] = {}
    budget, kind = None, untuned
    for line in (RESULTS / path).read_text().splitlines():
        if m := re.search(r"; budget ([\d.]+) GiB$", line):
            budget = float(m.group(1)) * 2**30
        elif line.startswith("round "):
            kind = tuned if "(autotuned)" in line else untuned
        elif m := re.match(r"\s+batch (\d+): peak ([\d.]+) GiB \+ ([\d.]+) MiB", line):
            kind[int(m.group(1))] = float(m.group(2)) * 2**30 + float(m.group(3)) * 2**20
    assert budget is not None, f"{path}: no budget line"
    return budget, curve(untuned), curve(tuned), None


def load(path: str):
    if path.endswith(".log"):
        return load_log(path)
    fit = json.loads((RESULTS / path).read_text())
    fit = fit.get("fit", fit)
    untuned, tuned = {}, {}
    for c in fit["candidates"]:
        if c["peak_bytes"] is None:
            continue
        (tuned if c["autotuned"] else untuned)[c["batch_size"]] = c["peak_bytes"] + c.get("next_input_bytes", 0)
    return fit["budget_bytes"], curve(untuned), curve(tuned), fit["batch_size"]


def replay(path: str, width: int) -> dict:
    budget, untuned, tuned, recorded = load(path)
    log: list[tuple[str, list[int]]] = []

    def oracle(peak, kind):
        def evaluate(batches):
            log.append((kind, list(batches)))
            return {b: peak(b) - budget for b in batches}

        return evaluate

    grid = Grid(1, 65536)
    found = search(oracle(untuned, "untuned"), grid, width=width, leave_open=left_open(width, 2))
    proved = prove(oracle(tuned, "autotuned"), grid, found, budget, width=2)
    return {
        "answer": proved.answer,
        "recorded_answer": recorded,
        "untuned_rounds": sum(1 for k, _ in log if k == "untuned"),
        "untuned_compiles": sum(len(b) for k, b in log if k == "untuned"),
        "autotuned_rounds": sum(1 for k, _ in log if k == "autotuned"),
        "autotuned_compiles": sum(len(b) for k, b in log if k == "autotuned"),
        "autotuned_batches": [b for k, b in log if k == "autotuned"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="4,8", help="untuned compiles per round to compare")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    print("| case | width | answer (recorded) | untuned rounds / compiles | autotuned rounds / compiles |")
    print("| --- | --- | --- | --- | --- |")
    totals = {w: [0, 0, 0] for w in widths}
    for name, path in CASES.items():
        for w in widths:
            r = replay(path, w)
            totals[w][0] += r["untuned_rounds"]
            totals[w][1] += r["autotuned_rounds"]
            totals[w][2] += r["autotuned_compiles"]
            print(
                f"| {name} | {w} | {r['answer']} ({r['recorded_answer'] or 'cut off'}) | {r['untuned_rounds']} / "
                f"{r['untuned_compiles']} | {r['autotuned_rounds']} / {r['autotuned_compiles']} |"
            )
    for w, (ur, tr, tc) in totals.items():
        print(f"width {w}: {ur} untuned rounds, {tr} autotuned rounds, {tc} autotuned compiles in all")


if __name__ == "__main__":
    main()
