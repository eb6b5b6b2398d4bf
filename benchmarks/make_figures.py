#!/usr/bin/env python3
"""Draw the figures of ``docs/images/`` from the committed measurements (``jaxfit.figures``).

    python benchmarks/make_figures.py [--out docs/images] [--skip-breakdown]

Every number drawn is read from a committed file; where a value is only in the journal's prose,
``benchmarks/results/figures/*.json`` holds it with a ``source`` naming the journal section and
the raw file:

- ``openpi.png``: the openpi table (configs by cards, fraction 0.9): each cell from its run's
  ``-run.json`` (the answer, the GPU, whether the pinned run ended with exit 0) or its fit's log
  (the start-up out of memory), listed in ``results/figures/openpi.json`` (JOURNAL sections 9-34).
- ``fit-vs-trial-search.png``: ``results/h100/fit-v3/raw.jsonl`` (JOURNAL section 0), and the MLP's
  cut trial search from ``results/figures/fit-vs-trial-search.json`` (section 3a).
- ``tune.png``: ``results/h200/tune-standby/call3/a/tune-inline/tune.json`` (JOURNAL section 36).
- ``breakdown-gpt-tiny.png``: a fresh fit on this machine's CPU,
  ``jaxfit fit --example gpt-tiny --breakdown --no-cache --plot docs/images/breakdown-gpt-tiny.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from jaxfit.figures import OpenpiCell, SearchRow, TunePoint, openpi_figure, search_figure, tune_figure

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "results" / "figures"
FIT_V3 = REPO / "benchmarks" / "results" / "h100" / "fit-v3"
TUNE = REPO / "benchmarks" / "results" / "h200" / "tune-standby" / "call3" / "a" / "tune-inline" / "tune.json"
GiB = 2**30


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def card_bytes(card: str) -> int:
    """``24GiB`` -> 24 x 2**30 bytes; ``141GB`` -> 141 x 10**9."""
    m = re.fullmatch(r"(\d+)(GiB|GB)", card)
    if not m:
        raise ValueError(f"cannot read card {card!r}")
    return int(m.group(1)) * (GiB if m.group(2) == "GiB" else 10**9)


def card_label(card: str) -> str:
    return re.sub(r"(\d+)(GiB|GB)", r"\1 \2", card)


def short_gpu(kind: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``."""
    m = re.search(r"\b([A-Z]\d{2,3})\b", kind)
    return m.group(1) if m else kind


def openpi_cells() -> tuple[list[OpenpiCell], str]:
    """The openpi table's cells, each parsed from the file ``results/figures/openpi.json`` names."""
    spec = _load(DATA / "openpi.json")
    fraction = float(spec["fraction"])
    labels: dict[str, str] = spec["configs"]
    cells: list[OpenpiCell] = []
    gpus: set[str] = set()
    jax_versions: set[str] = set()
    for entry in spec["cells"]:
        config, card = entry["config"], entry["card"]
        label = f"{labels[config]}\n{config}"
        pool = fraction * card_bytes(card)
        if "run" in entry:
            path = REPO / entry["run"]
            record = _load(path)
            fit = record["fit"]
            device = fit["device"]
            if record["command"][2] != config:
                raise ValueError(f"{path}: runs {record['command'][2]}, not {config}")
            if device.get("total_bytes") != card_bytes(card) or fit["mem_fraction"] != fraction:
                raise ValueError(f"{path}: not the {card} card at fraction {fraction}")
            gpus.add(device["device_kind"])
            jax_versions.add(device["jax_version"])
            gpu = short_gpu(device["device_kind"])
            steps = next(int(a.split("=", 1)[1]) for a in record["command"] if a.startswith("--num-train-steps="))
            code = record["run"]["exit_code"]
            if code == 0 and record["run"]["program_pinned"]:
                cells.append(
                    OpenpiCell(
                        label, card_label(card), fit["batch_size"], "ran", f"{gpu}: pinned run,\n{steps} steps, 0 OOM"
                    )
                )
            else:
                log = path.with_suffix(".log").read_text(errors="replace")
                what = "cut after step 0" if re.search(r"^Step 0:", log, re.M) else "ended early"
                cells.append(
                    OpenpiCell(
                        label,
                        card_label(card),
                        fit["batch_size"],
                        "answered",
                        f"{gpu}: pinned run,\n{what} (exit {code})",
                    )
                )
        elif "log" in entry:
            path = REPO / entry["log"]
            text = path.read_text(errors="replace")
            failed = re.search(r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate ([\d.]+)GiB", text)
            if not failed or "jit_init" not in text:
                raise ValueError(f"{path}: no out of memory in openpi's start-up (jit_init)")
            named = re.search(r"NVIDIA (H\d+)", text)
            gpu = named.group(1) if named else "?"
            cells.append(
                OpenpiCell(
                    label,
                    card_label(card),
                    None,
                    "does not start",
                    f"{gpu}: jit_init out of\nmemory (a {failed.group(1)} GiB\nallocation)",
                )
            )
        else:
            state = spec["state"][config]
            state_gib = state["params_gib"] * (2 if state["ema"] else 1) + state["opt_gib"]
            if state_gib * GiB <= pool:
                raise ValueError(f"{config} on {card}: its state {state_gib:.2f} GiB fits the pool")
            cells.append(
                OpenpiCell(
                    label,
                    card_label(card),
                    None,
                    "does not fit",
                    f"state {state_gib:.2f} GiB\n> pool {pool / GiB:.2f} GiB",
                )
            )
    title = (
        f"openpi (15a9616, its own train.py on fake data) at fraction {fraction:g} of each card: "
        "the batch jaxfit answered, and its pinned run\n"
        f"one GPU per cell, standing for the card: {' or '.join(sorted(gpus))}; jax {', '.join(sorted(jax_versions))}"
    )
    return cells, title


def search_rows() -> tuple[list[SearchRow], str]:
    """jaxfit against the trial search per workload, from ``fit-v3/raw.jsonl`` (later records win)."""
    spec = _load(DATA / "fit-vs-trial-search.json")
    records = [json.loads(line) for line in (REPO / spec["raw"]).read_text().splitlines() if line.strip()]
    rows: list[SearchRow] = []
    devices: set[str] = set()
    jax_versions: set[str] = set()
    for name in dict.fromkeys(r["workload"] for r in records):
        fraction = [r for r in records if r["workload"] == name][-1]["mem_fraction"]
        mine = [r for r in records if r["workload"] == name and r["mem_fraction"] == fraction]
        fits = [r for r in mine if "jaxfit_cold" in r and r["jaxfit_cold"].get("ok")]
        if not fits:
            continue
        cold, cached = fits[-1]["jaxfit_cold"], fits[-1]["jaxfit_cached"]
        devices.add(fits[-1]["device"])
        jax_versions.add(_load(FIT_V3 / f"{name}.fit.json")["device"]["jax_version"])
        truth = [r for r in mine if "true_max" in r]
        note = ""
        if truth:
            trial_s, trial_answer, at_least = float(truth[-1]["trial_wall_s"]), truth[-1]["true_max"], False
        else:
            cut = spec["trials_transcribed"][name]
            trial_s, trial_answer = float(cut["trial_wall_s"]), cut["true_max"]
            at_least = bool(cut["trial_wall_s_at_least"])
            note = f"(trial search cut after {cut['trials']} trials, on\nanother H100; {cut['true_max']}: its first boundary)"
        rows.append(
            SearchRow(
                workload=f"{name} at {fraction:g}",
                trial_seconds=trial_s,
                jaxfit_seconds=float(cold["wall_s"]),
                cached_seconds=float(cached["wall_s"]),
                trial_answer=trial_answer,
                jaxfit_answer=cold["result"]["batch_size"],
                trial_seconds_at_least=at_least,
                note=note,
            )
        )
    title = (
        "jaxfit fit against the trial search it replaces (double until out of memory, then bisect; "
        "3 real steps a trial)\n"
        f"one {', '.join(sorted(devices))}, jax {', '.join(sorted(jax_versions))}; "
        "jaxfit and the trials on the same warm GPU, one call after another"
        + ("; the MLP's trial search was cut, on another H100" if any(r.trial_seconds_at_least for r in rows) else "")
    )
    return rows, title


def tune_points() -> tuple[list[TunePoint], int | None, str]:
    """The rows of section 36's inline tune (call 3), the winner its ``best``."""
    tune = _load(TUNE)
    best = tune.get("best") or {}
    key = (best.get("setting"), best.get("micro_batch"), best.get("accum_steps"))
    points = [
        TunePoint(
            setting=r["setting"],
            micro_batch=r["micro_batch"],
            accum_steps=r["accum_steps"],
            peak_bytes=r["peak_bytes"],
            samples_per_second=r["samples_per_second"],
            status=r["status"],
            winner=(r["setting"], r["micro_batch"], r["accum_steps"]) == key,
        )
        for r in tune["rows"]
    ]
    budgets = {r["budget_bytes"] for r in tune["rows"] if r.get("budget_bytes")}
    words = tune["workload"].split()
    script = next((Path(w).parent.name + "/" + Path(w).name for w in words if w.endswith(".py")), words[0])
    config = words[words.index(next(w for w in words if w.endswith(".py"))) + 1]
    precision = next((w.split("=", 1)[1] for w in words if w.startswith("--precision=")), "")
    device = tune["device"]
    global_batch = {r["global_batch"] for r in tune["rows"]}
    title = (
        "jaxfit tune: samples/s of each setting against its proven peak\n"
        f"{script} {config} ({precision}, global batch {', '.join(map(str, sorted(global_batch)))}) "
        f"at fraction {tune['mem_fraction']:g}, --measure inline --parallel 5\n"
        f"one {device['device_kind']}, jax {device['jax_version']}; the tune took {tune['wall_seconds']:.0f} s"
    )
    return points, (budgets.pop() if len(budgets) == 1 else None), title


def breakdown(out: Path) -> Path:
    """A fresh fit of gpt-tiny on this machine's CPU, drawn by ``jaxfit fit --plot``."""
    path = out / "breakdown-gpt-tiny.png"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = ["fit", "--example", "gpt-tiny", "--breakdown", "--no-cache", "--plot", str(path)]
    subprocess.run([sys.executable, "-m", "jaxfit.cli", *command], check=True, env=env)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "docs" / "images"), help="the folder of the figures")
    parser.add_argument("--skip-breakdown", action="store_true", help="do not fit gpt-tiny again")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    cells, title = openpi_cells()
    written.append(openpi_figure(cells, out / "openpi.png", title=title))
    rows, title = search_rows()
    written.append(search_figure(rows, out / "fit-vs-trial-search.png", title=title))
    points, budget, title = tune_points()
    written.append(tune_figure(points, out / "tune.png", budget_bytes=budget, title=title))
    if not args.skip_breakdown:
        written.append(breakdown(out))
    for path in written:
        print(f"{path}: {path.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
