#!/usr/bin/env python3
"""A deviceless script fit with a lean start-up against one with the start-up run in full.

``jaxfit fit --script --gpu MODEL`` runs the script on this machine's CPU up to its first step.
With ``--lean-start`` (the default) the large outputs of the jitted functions it calls before the
step (its state's init) are traced, not computed; ``--no-lean-start`` computes them. This runs the
same fit both ways, one after the other, nothing cached, each under ``/usr/bin/time -v``, and
reports the wall time, the largest resident set of any process of the fit (the script's probe)
and the answers and peaks, which must be equal::

    python benchmarks/lean_start.py --out benchmarks/results/cpu/lean-start/gpt-small \\
        --fit "--gpu h100-sxm --mem-fraction 0.9" -- python3 scripts/train.py gpt_small --exp-name=lean

Everything after ``--`` is the script's command. Writes ``OUT/{lean,full}.json`` (jaxfit's JSON),
``OUT/{lean,full}.log`` (its output and ``time -v``'s) and ``OUT/summary.md``; exit 1 when the two
fits' answers or peaks differ. ``--keep`` reads a mode an earlier run finished instead of running it
again (``--modes lean`` first, ``--modes lean,full --keep`` later).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = {"lean": "--lean-start", "full": "--no-lean-start"}


def run_fit(mode: str, out: Path, fit_args: list[str], command: list[str], timeout: float) -> dict[str, Any]:
    """One fit in ``mode``; its wall seconds, largest resident set (KiB), exit code and JSON, as
    :func:`finished_fit` reads them (a fit that wrote no JSON: its own exit code and time)."""
    result_json, log = out / f"{mode}.json", out / f"{mode}.log"
    result_json.unlink(missing_ok=True)
    argv = [
        "/usr/bin/time", "-v", sys.executable, "-m", "jaxfit.cli", "fit", "--script", "--no-cache",
        MODES[mode], *fit_args, "--json", str(result_json), "--", *command,
    ]  # fmt: skip
    start = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
    finished = finished_fit(mode, out)
    if finished is not None:
        return finished
    return {"mode": mode, "code": code, "wall_s": time.monotonic() - start, "max_rss_kib": None, "fit": None}


def finished_fit(mode: str, out: Path) -> dict[str, Any] | None:
    """A fit in ``mode`` that an earlier run of this benchmark finished (its JSON and ``time -v``'s
    lines in its log), or None."""
    result_json, log = out / f"{mode}.json", out / f"{mode}.log"
    if not (result_json.exists() and log.exists()):
        return None
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    code = re.search(r"Exit status: (\d+)", text)
    if not (rss and wall and code):
        return None
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    fit = json.loads(result_json.read_text())
    return {"mode": mode, "code": int(code.group(1)), "wall_s": seconds, "max_rss_kib": int(rss.group(1)), "fit": fit}


def answer(fit: dict[str, Any] | None) -> tuple[Any, ...]:
    """What must agree: both answers and every compiled batch's peak, both searches."""
    if fit is None:
        return ()
    peaks = tuple(
        (side, c["batch_size"], c["peak_bytes"])
        for side in ("squeezed", "safe")
        for c in (fit.get(side) or {}).get("candidates", [])
    )
    return (fit.get("batch_size"), fit.get("squeezed_batch_size"), peaks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the logs, JSON and summary.md")
    parser.add_argument("--fit", default="", help="jaxfit fit options, one string (e.g. '--gpu h100-sxm')")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds for each fit")
    parser.add_argument("--modes", default="lean,full", help="which fits, in order (lean, full)")
    parser.add_argument("--keep", action="store_true", help="read a mode an earlier run finished instead of running it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the script's command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the script's command after --")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        parser.error(f"--modes takes lean and full, not {args.modes!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for mode in modes:
        run = finished_fit(mode, args.out) if args.keep else None
        if run is None:
            print(f"{time.strftime('%H:%M:%S')} {mode} ...", flush=True)
            run = run_fit(mode, args.out, shlex.split(args.fit), command, args.timeout)
        else:
            print(f"{mode}: read from {args.out}", flush=True)
        print(f"  exit {run['code']}, {run['wall_s']:.1f} s, max RSS {run['max_rss_kib']} KiB", flush=True)
        runs.append(run)
    lines = [
        f"`jaxfit fit --script --no-cache {args.fit} -- {shlex.join(command)}` on {os.cpu_count()} CPU cores, "
        "each mode under `/usr/bin/time -v` (max RSS: the largest process of the fit, the script's probe)",
        "",
        "| start-up | exit | wall | max RSS | safe batch | squeezed batch | safe peak at the answer |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        fit = run["fit"] or {}
        safe = fit.get("safe") or {}
        rss = f"{run['max_rss_kib'] / 2**20:.2f} GiB" if run["max_rss_kib"] else "-"
        lines.append(
            f"| {run['mode']} | {run['code']} | {run['wall_s']:.1f} s | {rss} | {fit.get('batch_size', '-')} | "
            f"{fit.get('squeezed_batch_size', '-')} | {safe.get('peak_bytes', '-')} B |"
        )
    same = len({answer(r["fit"]) for r in runs}) == 1 and all(r["fit"] for r in runs)
    if len(runs) > 1:
        lines += ["", "Answers and every compiled peak equal: " + ("yes" if same else "**no**")]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if same or len(runs) < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
