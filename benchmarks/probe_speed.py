"""Why does a script's probe time its proven step slower than a fresh process? (issue 21)

`jaxfit tune --script --measure inline` timed every proof of scripts/train.py gpt_small in the
script's probe 16-57 % below the same program in a fresh process, the excess growing with the
accumulation count (benchmarks/JOURNAL.md sections 27 and 30), so a script's rows are measured in
fresh processes: a start of the script each, what keeps a script's tune far from a quarter of
its grid. This times one row three ways on one GPU, one after the other:

1. ``probe``: fitted as the tune proves it (one autotuned compile of the global batch in the
   script's probe, whose pool is taken at start as an inline tune's is) and timed there
   (``FitOptions.time_steps``);
2. ``pinned``: a fresh process of the same command running the proof's program (its pin);
3. ``plain``: a fresh process compiling its own.

``--xla-flags`` adds XLA flags to all three (the same flags in the fit and the runs, as the pin
requires), to test a cause, e.g. ``--xla_gpu_enable_command_buffer=`` (no CUDA graphs).

    python benchmarks/probe_speed.py --out DIR [--remat none --accum 8] [--xla-flags ...]

Writes DIR/points.jsonl (each way as it ends) and prints a summary line per way.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tune import script_command
from pin_speed import fresh_point, row_arguments


def main() -> int:
    p = row_arguments(__doc__.splitlines()[0])
    p.add_argument("--xla-flags", default="", help="added to XLA_FLAGS of the probe and both runs")
    p.add_argument("--label", default="", help="names this variant in points.jsonl")
    p.add_argument("--ways", default="probe,pinned,plain", help="which of the three ways to time, in order")
    p.add_argument(
        "--variants",
        default="",
        help="the probe also times the program these ways ($JAXFIT_TIME_VARIANTS: again, reload, thread, noise)",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.variants:
        os.environ["JAXFIT_TIME_VARIANTS"] = args.variants
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]

    import jaxfit
    from jaxfit.fit.children import shared_compile_process

    checkpoints = tempfile.mkdtemp(prefix="probe-speed-ck-")
    command = script_command(args.config, args.precision, "probespeed", 40, checkpoints)
    command += [f"--remat={args.remat}", f"--grad-accum-steps={args.accum}"]
    g, label = args.global_batch, args.label or (args.xla_flags or "default")

    def record(way: str, point: dict) -> None:
        point.update(way=way, label=label, remat=args.remat, accum=args.accum, xla_flags=args.xla_flags)
        with (out / "points.jsonl").open("a") as f:
            f.write(json.dumps(point) + "\n")
        rate = point.get("samples_per_second")
        said = (
            f"{rate:.1f} samples/s, step {point['step_seconds']:.4f} s"
            if rate
            else str(point.get("error") or point.get("tail") or "failed")
        )
        print(f"{label} {way} {args.remat} {g // args.accum} x {args.accum}: {said} ({point['wall_s']} s)", flush=True)

    options = jaxfit.FitOptions(
        mem_fraction=args.fraction,
        min_batch=g,
        max_batch=g,
        multiple_of=args.accum,
        use_cache=False,
        time_steps=(args.warmup, args.steps),
    )
    start = time.time()
    with shared_compile_process(preallocate=True):  # as an inline tune's probes: the pool taken at start
        fit = jaxfit.fit_batch(jaxfit.script_source(command), options)
    timing = fit.timing or {}
    point: dict = {"batch": g, "wall_s": round(time.time() - start, 2), "peak_bytes": fit.peak_bytes}
    if timing.get("ok"):
        step = statistics.median(timing["step_seconds"])
        point.update(ok=True, step_seconds=step, samples_per_second=g / step, all_steps=timing["step_seconds"])
    else:
        point.update(ok=False, error=str(timing.get("error") or "not timed"))
    if timing.get("variants"):
        point["variants"] = timing["variants"]
        for name, value in timing["variants"].items():
            said = f"step {statistics.median(value):.4f} s" if isinstance(value, list) and value else str(value)
            print(f"{label} probe variant {name}: {said}", flush=True)
    record("probe", point)
    pinned_env = {k: v for k, v in fit.run_env().items() if k.startswith("JAXFIT_PIN")}
    batch_cmd = [*command, f"--batch-size={g}"]
    report = out / f"pin-report-{label}.json".replace("/", "_")
    for way in [w for w in ways if w != "probe"]:
        record(way, fresh_point(batch_cmd, args, pinned_env if way == "pinned" else None, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
