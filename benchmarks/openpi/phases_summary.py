"""A markdown table of where cold fits spent their time, from their ``--json`` files.

python3 benchmarks/openpi/phases_summary.py OUT/w*/*.json
"""

from __future__ import annotations

import json
import pathlib
import sys


def row(path: pathlib.Path) -> str:
    fit = json.loads(path.read_text())
    p = fit.get("phases") or {}
    tuned = [c for c in fit["candidates"] if c["autotuned"] and not c["cached"]]
    untuned = [c for c in fit["candidates"] if not c["autotuned"] and not c["cached"]]
    mean = lambda cs, k: sum(c[k] for c in cs) / len(cs) if cs else 0.0  # noqa: E731
    return (
        f"| {path.stem} | {path.parent.name} | {fit['batch_size']} | {fit['compiles']} / {fit['rounds']} | "
        f"{fit['wall_seconds']:.0f} | {p.get('start_seconds', 0):.0f} | "
        f"{p.get('search_rounds', 0)} / {p.get('search_seconds', 0):.0f} | {p.get('proof_rounds', 0)} / "
        f"{p.get('proof_seconds', 0):.0f} | {p.get('lower_seconds', 0):.0f} | {p.get('pin_seconds', 0):.0f} | "
        f"{mean(untuned, 'compile_seconds'):.0f} / {mean(tuned, 'compile_seconds'):.0f} | "
        f"{mean(untuned + tuned, 'lower_seconds'):.1f} |"
    )


def main() -> None:
    print(
        "| fit | width | answer | compiles / rounds | wall s | start-up s | search rounds / s | "
        "proof rounds / s | lowering s | pin s | mean compile s untuned / autotuned | mean lowering s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for arg in sys.argv[1:]:
        print(row(pathlib.Path(arg)))


if __name__ == "__main__":
    main()
