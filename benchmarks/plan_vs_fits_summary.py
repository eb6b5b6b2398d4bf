"""Summary of benchmarks/plan_vs_fits_x1.sh: the plan's wall time against the sum of its single fits, and
whether each cell gave the single fit's answer.

    python3 benchmarks/plan_vs_fits_summary.py DIR CARD [CARD ...]
"""

from __future__ import annotations

import json
import pathlib
import sys


def seconds(folder: pathlib.Path, name: str) -> float | None:
    path = folder / f"{name}.seconds"
    return float(path.read_text()) if path.exists() else None


def main() -> None:
    folder, cards = pathlib.Path(sys.argv[1]), sys.argv[2:]
    plan_path = folder / "plan.json"
    cells = json.loads(plan_path.read_text())["cells"] if plan_path.exists() else []
    by_card = {c["card"]: c for c in cells}
    print(
        "| card | plan cell: batch | plan cell: s | single fit: batch | single fit: compiles / rounds | single fit: s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    total, missing = 0.0, []
    for card in cards:
        fit_path = folder / f"fit-{card}.json"
        fit = json.loads(fit_path.read_text()) if fit_path.exists() else {}
        fit = fit.get("fit", fit)
        s = seconds(folder, f"fit-{card}")
        if s is None:
            missing.append(card)
        else:
            total += s
        phases = fit.get("phases") or {}
        rounds = (phases.get("search_rounds") or 0) + (phases.get("proof_rounds") or 0)
        print(
            f"| {card} | {by_card.get(card, {}).get('batch_size')} | {by_card.get(card, {}).get('seconds')} | "
            f"{fit.get('batch_size')} | "
            f"{len(fit.get('candidates') or [])} / {rounds} | {'not run' if s is None else f'{s:.1f}'} |"
        )
    plan_s = seconds(folder, "plan")
    fits = f"{total:.1f} s" + (f" (not run: {', '.join(missing)})" if missing else "")
    print(f"\nplan: {'not run' if plan_s is None else f'{plan_s} s'}; the single fits together: {fits}")


if __name__ == "__main__":
    main()
