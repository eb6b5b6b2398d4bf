#!/usr/bin/env python3
"""Does a cheaper GPU autotuning level change the compiled peak, and how much time does it save?

``jaxfit fit`` compiles every round after the seed round with XLA's autotuning on (level 4, as the
training run itself will), and those compiles are most of its wall time. This runs the same fit
(cold cache each time) with ``JAXFIT_AUTOTUNE_LEVEL`` unset, 2 and 1, and records the answer, the
wall time and every candidate's peak, so the peaks at the batches compiled under more than one level
can be compared. Usage (GPU machine): ``python benchmarks/bench_autotune_level.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [("gpt-small", [], 0.12)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--levels", default="default,2,1")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for example, sets, fraction in CASES:
        for level in args.levels.split(","):
            env = dict(os.environ, JAXFIT_CACHE_DIR=tempfile.mkdtemp(prefix="jaxfit-level-"))
            env.pop("JAXFIT_AUTOTUNE_LEVEL", None)
            if level != "default":
                env["JAXFIT_AUTOTUNE_LEVEL"] = level
            path = args.out / f"{example}-{fraction}-level-{level}.json"
            started = time.time()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "jaxfit.cli",
                    "fit",
                    "--example",
                    example,
                    *sets,
                    "--mem-fraction",
                    str(fraction),
                    "--json",
                    str(path),
                    "--quiet",
                ],
                capture_output=True,
                text=True,
                env=env,
                cwd=REPO,
            )
            wall = time.time() - started
            fit = json.loads(path.read_text()) if path.exists() else {}
            tuned = {c["batch_size"]: c["peak_bytes"] for c in fit.get("candidates", []) if c["autotuned"]}
            row = {
                "example": example,
                "fraction": fraction,
                "level": level,
                "exit_code": proc.returncode,
                "wall_seconds": round(wall, 1),
                "batch_size": fit.get("batch_size"),
                "fit_wall_seconds": fit.get("wall_seconds"),
                "tuned_peaks": tuned,
                "stderr_tail": proc.stderr[-800:],
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
            with open(args.out / "raw.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
