#!/usr/bin/env python3
"""The markdown table of deviceless estimates that ``cpu_cards.sh`` (or any ``jaxfit fit --gpu
--json``) wrote: one row per JSON file given, in order::

    python benchmarks/openpi/cards_table.py benchmarks/results/cpu/openpi-cards/pi0_libero_low_mem_finetune-*.json

Columns: the GPU model, the memory the compiler was told the card has, the fraction and the limit
it gives, the safe estimate (its peak), the squeezed one (its peak), the compiles of both
searches and their wall time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 2**30


def row(path: Path) -> str:
    """One table row for the estimate in ``path``."""
    data = json.loads(path.read_text())
    safe, squeezed = data["safe"], data["squeezed"] or {}
    device = safe["device"]

    def peak(result: dict, batch: int | None) -> str:
        found = [c["peak_bytes"] for c in result.get("candidates", []) if c["batch_size"] == batch]
        return f"{found[0] / GIB:.2f} GiB" if found else "-"

    compiles = safe.get("compiles", 0) + squeezed.get("compiles", 0)
    wall = safe.get("wall_seconds", 0.0) + squeezed.get("wall_seconds", 0.0)
    return (
        f"| {device['device_kind']} | {device['total_bytes'] / GIB:.2f} GiB | {safe['mem_fraction']:g} "
        f"({safe['limit_bytes'] / GIB:.2f} GiB) | **{data['batch_size']}** ({peak(safe, data['batch_size'])}) | "
        f"{data['squeezed_batch_size']} ({peak(squeezed, data['squeezed_batch_size'])}) | {compiles} | {wall:.0f} s | "
        f"`{path.name}` |"
    )


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    print(
        "| GPU model | memory | fraction (limit) | safe estimate (peak) | squeezed (peak) | compiles | searches | file |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in paths:
        print(row(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
