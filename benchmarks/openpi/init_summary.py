#!/usr/bin/env python3
"""The summary of a ``gpu_init.sh`` call: for each config, what jaxfit's probe reported with random
init and with the weights loaded from a checkpoint under the card's limit, and each start-up's peak.

    python3 benchmarks/openpi/init_summary.py CELLS_DIR

Reads ``CONFIG-random.{json,log}``, ``CONFIG-ckpt.{json,log}``, ``CONFIG-peak.log``, their
``*.memory.jsonl`` (``train_fake.py``'s ``OPENPI_MEMORY_LOG``), ``CONFIG-make_checkpoint.log``,
``sides.txt`` and ``smi.csv``. Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SIDE = re.compile(r"^(.+?)-(random|ckpt|peak)\.log$")
NOTABLE = re.compile(
    r"RESOURCE_EXHAUSTED|[Oo]ut of memory|does not fit|not even|fits:|error|Error|exit|make_checkpoint|"
    r"Traceback|batch \d+ fits|estimate|start-up"
)


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def memory(path: Path) -> list[str]:
    lines = []
    if not path.exists():
        return ["    no memory log (the script did not reach its first batch)"]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]
    for row in rows:
        devices = "; ".join(
            f"peak {gib(d.get('peak_bytes_in_use'))}, in use {gib(d.get('bytes_in_use'))}, limit {gib(d.get('bytes_limit'))}"
            for d in row.get("devices", [])
        )
        lines.append(
            f"    {row.get('after')} (+{row.get('seconds')} s): {devices}; host max RSS {gib(row.get('host_max_rss_bytes'))}"
        )
    if len(rows) < 2:
        lines.append("    no line after init_train_state: openpi's init did not finish")
    return lines


def main() -> None:
    cells = Path(sys.argv[1])
    configs = sorted({m.group(1) for p in cells.iterdir() if (m := SIDE.match(p.name))})
    for config in configs:
        print(f"== {config}")
        made = cells / f"{config}-make_checkpoint.log"
        if made.exists():
            for line in made.read_text(errors="replace").splitlines():
                if line.startswith("make_checkpoint") or "Error" in line:
                    print(f"  {line}")
        for side in ("random", "ckpt", "peak"):
            log = cells / f"{config}-{side}.log"
            if not log.exists():
                continue
            print(f"  [{side}]")
            result = None
            try:
                result = json.loads((cells / f"{config}-{side}.json").read_text())
            except (OSError, ValueError):
                pass
            if result is not None:
                print(
                    f"    jaxfit: batch {result['batch_size']} ({result['outcome']}), peak {gib(result['peak_bytes'])} of a "
                    f"{gib(result['budget_bytes'])} budget; {result['compiles']} compiles, {result['wall_seconds']:.0f} s"
                )
                print(f"    {result.get('message', '')}")
            notable = [line.strip() for line in log.read_text(errors="replace").splitlines() if NOTABLE.search(line)]
            for line in notable[-8:]:
                print(f"    | {line[:400]}")
            print("\n".join(memory(cells / f"{config}-{side}.memory.jsonl")))
    sides = cells / "sides.txt"
    if sides.exists():
        print("== sides")
        print(sides.read_text().rstrip())
    smi = cells / "smi.csv"
    if smi.exists():
        values = [int(v) for v in re.findall(r",\s*(\d+) MiB", smi.read_text())]
        if values:
            print(f"== GPU memory used (all processes): at most {max(values)} MiB ({len(values)} samples, 1 s apart)")


if __name__ == "__main__":
    main()
