"""The same cold `jaxfit fit` with jaxfit as it was at a git revision and as it is now, alternating.

    python benchmarks/before_after.py REV [--runs N] [--out DIR] [--before-src DIR] -- FIT ARGS...
    e.g. python benchmarks/before_after.py 825d286 --runs 3 -- --example gpt-small --mem-fraction 0.3

The revision's `jaxfit/` and `configs/` are exported (`git archive`) to a folder of its own and put first on
PYTHONPATH for the "before" runs; the "after" runs use this working tree. Runs alternate (after,
before, after, ...: any warming of the machine favours the baseline first), each with an empty
cache folder of its own (`JAXFIT_CACHE_DIR`: no answer and no compile reused). Each run's JSON
and log go to --out; the table compares answers and where the time went (the fit's "phases").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def export(rev: str, into: pathlib.Path) -> pathlib.Path:
    """The revision's ``jaxfit/`` package under ``into``, with the ``configs/`` its examples read."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "jaxfit", "configs"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run(side: str, source: pathlib.Path, args: list[str], out: pathlib.Path, index: int) -> dict:
    tag = f"{side}-{index}"
    with tempfile.TemporaryDirectory(prefix="jaxfit-cold-") as cache:
        env = dict(
            os.environ,
            JAXFIT_CACHE_DIR=cache,
            PYTHONPATH=os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")])),
        )
        start = time.perf_counter()
        with open(out / f"{tag}.log", "w") as log:
            rc = subprocess.run(
                [sys.executable, "-m", "jaxfit.cli", "fit", *args, "--json", str(out / f"{tag}.json")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tempfile.gettempdir(),
            ).returncode
        wall = time.perf_counter() - start
    data = json.loads((out / f"{tag}.json").read_text()) if (out / f"{tag}.json").exists() else {}
    phases = data.get("phases") or {}
    row = {
        "side": side,
        "run": index,
        "rc": rc,
        "wall_s": round(wall, 1),
        "answer": data.get("batch_size"),
        "peak_bytes": data.get("peak_bytes"),
        "compiles": data.get("compiles"),
        "rounds": data.get("rounds"),
        **{k: phases.get(k) for k in ("start_seconds", "search_seconds", "proof_seconds", "lower_seconds")},
        "fit_seconds": data.get("wall_seconds"),
    }
    print(json.dumps(row), flush=True)
    return row


def _median(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{statistics.median(values):.1f}" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the git revision of the baseline")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/before-after"))
    parser.add_argument(
        "--before-src",
        type=pathlib.Path,
        help="a folder holding the baseline's jaxfit/ already (where there is no git: a GPU machine's copy)",
    )
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("give the arguments of `jaxfit fit` after --")
    split = argv.index("--")
    ns, args = parser.parse_args(argv[:split]), argv[split + 1 :]
    ns.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="jaxfit-before-") as before:
        baseline = ns.before_src.resolve() if ns.before_src else export(ns.rev, pathlib.Path(before))
        sources = {"before": baseline, "after": REPO}
        for i in range(ns.runs):
            for side in ("after", "before"):
                rows.append(run(side, sources[side], args, ns.out, i))
    (ns.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"\n`jaxfit fit {' '.join(args)}`, {ns.rev} (before) against this tree (after), {ns.runs} cold runs each\n")
    print(
        "| side | answers | compiles / rounds | fit, median (s) | search, median (s) | proof, median (s) | runs (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for side in ("before", "after"):
        mine = [r for r in rows if r["side"] == side]
        ok = [r for r in mine if r["rc"] == 0 and r["fit_seconds"] is not None]
        times = ", ".join(f"{r['fit_seconds']:.1f}" if r["fit_seconds"] else f"rc {r['rc']}" for r in mine)
        print(
            f"| {side} | {sorted({r['answer'] for r in mine}, key=str)} | "
            f"{sorted({(r['compiles'], r['rounds']) for r in ok})} | {_median(ok, 'fit_seconds')} | "
            f"{_median(ok, 'search_seconds')} | {_median(ok, 'proof_seconds')} | "
            f"{times} |"
        )
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
