#!/usr/bin/env python3
"""The summary of a ``gpu_deviceless.sh`` call: each config's proven answer on the card against its
deviceless estimate, and the peaks both sides compiled at the same batch.

    python3 benchmarks/openpi/deviceless_summary.py CELLS_DIR

Reads ``CONFIG-card.json`` (``jaxfit fit --script``'s JSON) and ``CONFIG-deviceless.json``
(``jaxfit fit --script --gpu-spec``'s), and where a side was cut before its JSON, the compiles its
log printed (``round N: compiling batch ...`` / ``  batch B: peak X GiB ... fits (T s)``). Standard
library only; prints to stdout.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
ROUND = re.compile(r"^round (\d+): compiling batch (.*?)( \(autotuned\))?\s*$")
BATCH = re.compile(r"^\s+batch (\d+): peak ([\d.]+) (B|KiB|MiB|GiB|TiB)\b.*?(fits|does not fit)(?: \(([\d.]+) s\))?")
START = re.compile(r"^starting a compile child")
SIDE = re.compile(r"^(.+?)-(card|deviceless)(-squeezed|-safe)?\.(json|log)$")


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def from_log(path: Path) -> list[list[dict]]:
    """The compiles a log printed, one list per compile child (a deviceless fit starts two: squeezed, safe)."""
    searches: list[list[dict]] = []
    tuned = False
    for line in path.read_text(errors="replace").splitlines():
        if START.match(line):
            searches.append([])
            continue
        m = ROUND.match(line)
        if m:
            tuned = bool(m.group(3))
            continue
        m = BATCH.match(line)
        if m and searches:
            searches[-1].append(
                {
                    "batch_size": int(m.group(1)),
                    "peak_bytes": float(m.group(2)) * UNITS[m.group(3)],  # rounded to the hundredth of a unit
                    "fits": m.group(4) == "fits",
                    "autotuned": tuned,
                    "compile_seconds": float(m.group(5)) if m.group(5) else None,
                    "from_log": True,
                }
            )
    return searches


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def curve(candidates: list[dict], tuned: bool) -> dict[int, float]:
    return {
        c["batch_size"]: c["peak_bytes"]
        for c in candidates
        if c.get("peak_bytes") is not None and bool(c.get("autotuned")) == tuned
    }


def describe(label: str, result: dict) -> str:
    return (
        f"  {label}: batch {result['batch_size']} ({result['outcome']}): peak {gib(result['peak_bytes'])} of a "
        f"{gib(result['budget_bytes'])} budget (limit {gib(result['limit_bytes'])}, {result['limit_bytes']} B); "
        f"{result['compiles']} compiles in {result['rounds']} rounds, {result['wall_seconds']:.0f} s"
    )


def listed(cands: list[dict]) -> str:
    rows = sorted(cands, key=lambda c: (bool(c.get("autotuned")), c["batch_size"]))
    return ", ".join(
        f"{c['batch_size']}{'T' if c.get('autotuned') else ''}: {gib(c['peak_bytes'])}{'' if c['fits'] else ' (no)'}"
        for c in rows
        if c.get("peak_bytes") is not None
    )


def main() -> None:
    cells = Path(sys.argv[1])
    configs = sorted({m.group(1) for p in cells.iterdir() if (m := SIDE.match(p.name))})
    for config in configs:
        print(f"== {config}")
        card = load(cells / f"{config}-card.json")
        card_log = cells / f"{config}-card.log"
        card_cands: list[dict] = []
        if card is not None:
            print(describe("proven on the card", card))
            print(f"    {card.get('message', '')}")
            card_cands = card["candidates"]
        elif card_log.exists():
            searches = from_log(card_log)
            card_cands = [c for s in searches for c in s]
            print(f"  card: no JSON (cut or failed); {len(card_cands)} compiles in its log")
            print("    " + " | ".join(card_log.read_text(errors="replace").strip().splitlines()[-3:])[:600])
        if card_cands:
            print(f"    card compiles (T: autotuned): {listed(card_cands)}")

        squeezed: list[dict] = []
        safe: list[dict] = []
        dl = load(cells / f"{config}-deviceless.json")  # `jaxfit fit --gpu-spec` (DL_MODE=cli)
        halves = {h: load(cells / f"{config}-deviceless-{h}.json") for h in ("squeezed", "safe")}  # DL_MODE=halves
        if dl is None and any(halves.values()):
            dl = {
                "squeezed": (halves["squeezed"] or {}).get("squeezed"),
                "safe": (halves["safe"] or {}).get("safe"),
            }
            dl["batch_size"] = (dl["safe"] or {}).get("batch_size")
            dl["squeezed_batch_size"] = (dl["squeezed"] or {}).get("batch_size")
            dl["summary"] = "the two searches in two processes (deviceless_half.py)" + (
                "" if halves["squeezed"] and halves["safe"] else "; the other half has no JSON (not run, cut or failed)"
            )
            safe_b, squeezed_b = dl["batch_size"], dl["squeezed_batch_size"]
            if safe_b is not None and squeezed_b is not None and safe_b > squeezed_b:
                dl["summary"] += (
                    f"; the safe search's answer {safe_b} is above the squeezed one: `fit --gpu-spec` "
                    f"would have stopped it at {squeezed_b}"
                )
        if dl is not None:
            print(
                f"  deviceless: safe {dl.get('batch_size')}, squeezed {dl.get('squeezed_batch_size')}: {dl.get('summary')}"
            )
            for label in ("squeezed", "safe"):
                if dl.get(label):
                    print(describe(f"deviceless {label}", dl[label]))
            squeezed = (dl.get("squeezed") or {}).get("candidates", [])
            safe = (dl.get("safe") or {}).get("candidates", [])
        for label, logs in (
            ("squeezed", [cells / f"{config}-deviceless-squeezed.log"]),
            ("safe", [cells / f"{config}-deviceless-safe.log"]),
            ("both", [cells / f"{config}-deviceless.log"]),
        ):
            for log in logs:
                if not log.exists() or (dl is not None and dl.get(label if label != "both" else "squeezed")):
                    continue
                searches = from_log(log)
                if label == "both":
                    squeezed = squeezed or (searches[0] if searches else [])
                    safe = safe or (searches[1] if len(searches) > 1 else [])
                elif label == "squeezed":
                    squeezed = squeezed or (searches[0] if searches else [])
                else:
                    safe = safe or (searches[0] if searches else [])
                print(f"  deviceless {label}: no JSON (cut or failed); its log: {sum(map(len, searches))} compiles")
                print("    " + " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])[:600])
        if squeezed:
            print(f"    deviceless squeezed compiles: {listed(squeezed)}")
        if safe:
            print(f"    deviceless safe (plain) compiles: {listed(safe)}")

        # the same batch on both sides
        untuned, tuned = curve(card_cands, False), curve(card_cands, True)
        dl_sq, dl_plain = curve(squeezed, False), curve(safe, False)
        for name, other in (("untuned", untuned), ("autotuned", tuned)):
            for dl_name, dl_curve in (("squeezed", dl_sq), ("plain", dl_plain)):
                common = sorted(set(other) & set(dl_curve))
                if common:
                    print(
                        f"    card {name} vs deviceless {dl_name}: "
                        + ", ".join(
                            f"{b}: {other[b]:.0f} vs {dl_curve[b]:.0f} B ({(dl_curve[b] - other[b]) / other[b]:+.2%})"
                            for b in common
                        )
                    )
        if card is not None and dl is not None:
            proven = card["batch_size"]
            if card["outcome"] != "boundary":
                print(f"    note: the card's answer is not a boundary ({card['outcome']}): the window missed it")
            for label, value in (("safe", dl.get("batch_size")), ("squeezed", dl.get("squeezed_batch_size"))):
                if value is not None:
                    side = (
                        "above the proven answer: the card's program runs out of memory" if value > proven else "safe"
                    )
                    print(f"    {label} {value} vs proven {proven}: {value - proven:+d} samples ({side})")

    for path in sorted(cells.glob("*.memory.jsonl")):  # train_fake.py's OPENPI_MEMORY_LOG, one line a start-up point
        print(f"== start-up memory of {path.name[: -len('.memory.jsonl')]}")
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            devices = "; ".join(
                f"{d['kind']}: peak {gib(d.get('peak_bytes_in_use'))}, in use {gib(d.get('bytes_in_use'))}, "
                f"limit {gib(d.get('bytes_limit'))}"
                for d in row.get("devices", [])
                if d.get("peak_bytes_in_use") is not None
            )
            print(
                f"  {row.get('after')} (+{row.get('seconds')} s): host max RSS {gib(row.get('host_max_rss_bytes'))}"
                + (f"; {devices}" if devices else "")
            )
    for name in ("sides.txt",):
        path = cells / name
        if path.exists():
            print(f"== {name}")
            print(path.read_text().rstrip())
    mem = cells / "host-mem.txt"
    if mem.exists():
        rows = [line.split() for line in mem.read_text().splitlines() if len(line.split()) >= 3]
        used = [(int(r[1]), int(r[0])) for r in rows if r[1].isdigit() and r[0].isdigit()]
        if used:
            peak, at = max(used)
            print(f"== host memory: at most {peak} MiB used (at +{at} s), {len(used)} samples")
    smi = cells / "smi.csv"
    if smi.exists():
        values = [int(v) for v in re.findall(r",\s*(\d+) MiB", smi.read_text())]
        if values:
            print(f"== GPU memory used: at most {max(values)} MiB ({len(values)} samples)")


if __name__ == "__main__":
    main()
