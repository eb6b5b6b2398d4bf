#!/usr/bin/env python3
"""What the deviceless safe estimate would answer under other margins, against proven answers.

The safe estimate is the largest batch whose plain (unsqueezed, untuned) deviceless program, with
the loop's next batch, fits the limit less a margin (12 % since this replay; 5 % before). For each recorded estimate that has
a proven answer on the card, this reads the safe search's compiled batches from its JSON, takes each
batch's need (peak + next batch) as linear between compiled batches, and says, for margins of 5 to
15 %, which batch the rule would answer, whether it is above the proof, and how many samples under
it. A model of the curve between compiled batches, not new compiles::

    python benchmarks/safe_margin.py

Output: one markdown table, and the smallest margin that keeps every case at or under its proof.
The answers at 5 % are the recorded ones (all six estimates were made under it), a check of the model.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
R = HERE / "results"
CASES = [
    # (name, deviceless estimate JSON, proven batch, where the proof is recorded)
    ("gpt-small f32, H200 0.12", R / "h200/deviceless/call1/gpt-small-f32.deviceless.json", 13, "h200/deviceless/call1"),
    ("gpt-small bf16 remat, H200 0.05", R / "h200/deviceless/call1/gpt-small-bf16-remat.deviceless.json", 30,
     "h200/deviceless/call1"),
    ("vit-small f32, H200 0.06", R / "h200/deviceless/call2/vit-small-f32.deviceless.json", 124, "h200/deviceless/call1"),
    ("vit-small bf16, H200 0.06", R / "h200/deviceless/call2/vit-small-bf16.deviceless.json", 238, "h200/deviceless/call2"),
    ("openpi pi0 LoRA, H100 0.9", R / "h100/deviceless-openpi/call1/pi0_libero_low_mem_finetune-deviceless-safe.json", 220,
     "h100/deviceless-openpi/call1"),
    ("openpi pi0 LoRA, H200 at 141 GB 0.9", R / "cpu/openpi-cards/pi0_libero_low_mem_finetune-h200-141GB.json", 285,
     "h200x2/openpi/call6"),
]  # fmt: skip
MARGINS = [0.05, 0.08, 0.10, 0.12, 0.15]


def needs(path: Path) -> tuple[list[tuple[int, int]], int]:
    """The safe search's ``(batch, peak + next batch)`` in batch order, and the limit."""
    safe = json.loads(path.read_text())["safe"]
    points = sorted(
        {c["batch_size"]: c["peak_bytes"] + c.get("next_input_bytes", 0) for c in safe["candidates"]}.items()
    )
    return points, int(safe["limit_bytes"])


def answer(points: list[tuple[int, int]], budget: float) -> int | None:
    """The largest batch whose need, linear between compiled batches, fits ``budget`` (None: none
    from the smallest compiled batch up)."""
    best = None
    for (b0, n0), (b1, n1) in itertools.pairwise(points):
        slope = (n1 - n0) / (b1 - b0)
        for b in range(b0, b1 + 1):
            if n0 + slope * (b - b0) <= budget:
                best = b if best is None or b > best else best
    return best


def main() -> int:
    head = "| case | proven (results/...) | " + " | ".join(f"{m:.0%} margin" for m in MARGINS) + " |"
    lines = [head, "| --- | ---: | " + " | ".join("---:" for _ in MARGINS) + " |"]
    worst = {m: False for m in MARGINS}
    for name, path, proven, proof in CASES:
        if not path.exists():
            print(f"missing: {path}", file=sys.stderr)
            continue
        points, limit = needs(path)
        cells = []
        for m in MARGINS:
            got = answer(points, limit * (1 - m))
            if got is None:  # under the smallest batch the safe search compiled
                cells.append(f"under {points[0][0]} (not compiled)")
                continue
            over = got > proven
            worst[m] |= over
            cells.append(f"**{got}, above**" if over else f"{got} ({(proven - got) / proven:.0%} under)")
        lines.append(f"| {name} | {proven} (`{proof}`) | " + " | ".join(cells) + " |")
    safe = [m for m in MARGINS if not worst[m]]
    lines += ["", "Smallest margin with every case at or under its proof: " + (f"{safe[0]:.0%}" if safe else "none")]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
