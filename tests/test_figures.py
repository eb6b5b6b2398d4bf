"""Pictures: ``jaxfit fit --plot`` of a real CPU fit, each figure of ``jaxfit.figures`` from real
inputs (the committed measurements, through ``benchmarks/make_figures.py``), and bad ``--plot``
paths refused in one line before any compile."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from jaxfit.cli import main
from jaxfit.figures import (
    OpenpiCell,
    SearchRow,
    TunePoint,
    breakdown_figure,
    openpi_figure,
    search_figure,
    tune_figure,
)
from jaxfit.fit.results import FitResult

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--example", "mlp-tiny", "--device-memory", "8MiB", "--mem-fraction", "0.5", "--max-batch", "4096"]


def read_png(path: Path) -> tuple[int, int]:
    """(height, width) of a PNG that matplotlib reads back; checks its signature first."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG, path
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300, pixels.shape
    assert pixels.std() > 0.05, "a blank picture"
    return int(pixels.shape[0]), int(pixels.shape[1])


def make_figures():
    """``benchmarks/make_figures.py`` as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("make_figures", REPO / "benchmarks" / "make_figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_plot_writes_the_breakdown_picture(tmp_path, capsys):
    png, data = tmp_path / "breakdown.png", tmp_path / "fit.json"
    assert main(["fit", *SMALL, "--breakdown", "--plot", str(png), "--json", str(data)]) == 0
    out = capsys.readouterr().out
    assert "by component" in out and f"plot: {png}" in out
    read_png(png)
    result = FitResult.from_dict(json.loads(data.read_text()))
    assert result.breakdown and sum(c["bytes"] for c in result.breakdown) == result.peak_bytes

    # --plot alone draws the same picture (here answered from the cache), as SVG by its suffix
    svg = tmp_path / "breakdown.svg"
    assert main(["fit", *SMALL, "--plot", str(svg), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("batch ") and "plot:" not in out and "by component" not in out  # --quiet: the answer only
    text = svg.read_text()
    assert text.startswith("<?xml") and "<svg" in text and "budget" in text and "activations" in text

    # the Python API: a PDF, and an answer without a breakdown (jaxfit 0.2's cache) drawn whole
    pdf = breakdown_figure(dataclasses.replace(result, breakdown=[]), tmp_path / "whole.pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


@pytest.mark.parametrize(
    "name,suffix,message",
    [
        ("missing folder", "no/such/folder/b.png", "folder"),
        ("text suffix", "b.txt", "a figure is written as .png, .svg, .pdf"),
    ],
)
def test_a_bad_plot_path_is_one_line_before_any_compile(tmp_path, capsys, name, suffix, message):
    target = tmp_path / suffix
    assert main(["fit", *SMALL, "--plot", str(target)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"jaxfit: error: --plot {target}") and message in lines[0]
    assert "round 1" not in captured.err and not captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing written"


def test_the_figures_of_the_committed_measurements(tmp_path):
    figures = make_figures()
    cells, title = figures.openpi_cells()
    assert len(cells) == 30 and "H200" in title and "jax 0.11.2" in title
    by_status = {c.status for c in cells}
    assert by_status == {"ran", "answered", "does not start", "does not fit"}
    assert next(c for c in cells if c.config.startswith("pi0, full") and c.card == "80 GiB").batch == 51
    read_png(openpi_figure(cells, tmp_path / "openpi.png", title=title))

    rows, title = figures.search_rows()
    assert [r.jaxfit_answer for r in rows] == [13, 18, 23, 2473] and "H100" in title
    assert [r.trial_answer for r in rows] == [13, 18, 23, 2252] and rows[-1].trial_seconds_at_least
    read_png(search_figure(rows, tmp_path / "search.png", title=title))

    points, budget, title = figures.tune_points()
    winner = next(p for p in points if p.winner)
    assert (winner.setting, winner.micro_batch, winner.accum_steps) == ("--remat=none", 8, 8)
    assert budget and all((p.peak_bytes or 0) <= budget for p in points)
    read_png(tune_figure(points, tmp_path / "tune.png", budget_bytes=budget, title=title))


def test_each_figure_from_small_inputs(tmp_path):
    cells = [
        OpenpiCell("pi0, LoRA", "24 GiB", None, "does not start", "init out of memory"),
        OpenpiCell("pi0, LoRA", "48 GiB", 118, "ran", "H100: 3 steps"),
        OpenpiCell("pi0, full", "24 GiB", None, "does not fit", "state 48.25 GiB"),
        OpenpiCell("pi0, full", "48 GiB", 60, "answered", "cut"),
    ]
    assert openpi_figure(cells, tmp_path / "o.svg").read_text().startswith("<?xml")
    rows = [SearchRow("a", 100.0, 20.0, 0.5, 8, 8), SearchRow("b", 50.0, 10.0, None, None, 4, True, "cut")]
    read_png(search_figure(rows, tmp_path / "s.png"))
    points = [
        TunePoint("none", 8, 1, 6 << 20, 120.0, winner=True),
        TunePoint("none", 16, 1, 9 << 20, None, status="does not fit"),
        TunePoint("full", 8, 1, 3 << 20, 90.0, status="dropped"),
        TunePoint("full", 32, 1, None, None, status="does not fit"),
    ]
    read_png(tune_figure(points, tmp_path / "t.png", budget_bytes=8 << 20))


def test_importing_jaxfit_does_not_import_matplotlib():
    code = "import sys, jaxfit, jaxfit.figures, jaxfit.cli; print('matplotlib' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
