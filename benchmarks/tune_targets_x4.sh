#!/usr/bin/env bash
# Issue 21 on a host of 4 alike GPUs, in one call: `jaxfit tune` against the exhaustive grid of
# plain runs for two targets, every side alone on its GPU, cold caches:
#   GPU 0: jaxfit tune, gpt-small bf16, global batch 64, fraction 0.0706 (section 6's question);
#          then jaxfit tune, vit-small fp32, global batch $VIT_GLOBAL, fraction $VIT_FRACTION
#   GPU 1: the gpt-small grid's remat=none half      GPU 2: its remat=full half
#   GPU 3: the ViT grid's remat=none half, then its remat=full half
# Four sides compile on the host's CPUs at once, as in section 15's call.
# A grid's wall time is the sum of its two halves (what it takes on one card). Usage, from the
# repository root on the GPU machine (wheels of tyro and wandb carried in .whl):
#   OUT=$OUT bash benchmarks/tune_targets_x4.sh
# Everything it writes ends up in $OUT/all.tgz (a device call brings back at most 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/tune-targets}
LIMIT=${LIMIT_S:-565}
VIT_GLOBAL=${VIT_GLOBAL:-128}
VIT_FRACTION=${VIT_FRACTION:-0.03}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
gpt=(run --example gpt-small --global-batch 64 --fraction 0.0706 --precision bfloat16 --remat none,full)
vit=(run --example vit-small --global-batch "$VIT_GLOBAL" --fraction "$VIT_FRACTION" --precision float32 --remat none,full)
START=$SECONDS
side() {  # GPU then, one after another: NAME ARGS... ;; NAME ARGS...
  local gpu=$1
  shift
  (
    while [ $# -gt 0 ]; do
      local name=$1 args=()
      shift
      while [ $# -gt 0 ] && [ "$1" != ";;" ]; do args+=("$1"); shift; done
      [ $# -gt 0 ] && shift
      mkdir -p "$OUT/$name"
      local left=$((LIMIT - (SECONDS - START)))
      CUDA_VISIBLE_DEVICES=$gpu timeout --signal=TERM --kill-after=10 "$left" \
        python3 benchmarks/bench_tune.py "${args[@]}" --out "$OUT/$name" >"$OUT/$name/bench.log" 2>&1
      echo "$name exit $? at $((SECONDS - START)) s" | tee -a "$OUT/sides.txt"
    done
  ) &
}
side 0 gpt-tune "${gpt[@]}" --skip-grid ";;" vit-tune "${vit[@]}" --skip-grid
side 1 gpt-grid-none "${gpt[@]}" --remat none --skip-tune
side 2 gpt-grid-full "${gpt[@]}" --remat full --skip-tune
side 3 vit-grid-none "${vit[@]}" --remat none --skip-tune ";;" vit-grid-full "${vit[@]}" --remat full --skip-tune
wait
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for target in ("gpt", "vit"):
    raw = out / f"{target}-tune" / "raw.jsonl"
    tune = json.loads(raw.read_text().splitlines()[-1]) if raw.exists() else {}
    t = tune.get("tune") or {}
    b = t.get("best") or {}
    points, walls = [], {}
    for half in ("none", "full"):
        f = out / f"{target}-grid-{half}" / "grid-points.jsonl"
        got = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
        points += got
        walls[half] = round(sum(p["wall_s"] for p in got), 1)
    ok = [p for p in points if p.get("ok")]
    best = max(ok, key=lambda p: p["samples_per_second"], default=None)
    grid_s = sum(walls.values())
    print(f"== {target}: tune {tune.get('tune_wall_s')} s, phases {t.get('phase_seconds')}, best "
          f"{b.get('setting')} {b.get('micro_batch')} x {b.get('accum_steps')} {round(b.get('samples_per_second') or 0, 1)}")
    print(f"   grid {len(points)} points, {walls} = {grid_s:.1f} s; best "
          + (f"{best['setting']} {best['micro_batch']} x {best['accum_steps']} {best['samples_per_second']:.1f}" if best else "none"))
    if best and b and grid_s:
        print(f"   tune/grid time {tune['tune_wall_s'] / grid_s:.2f}; winner {b['samples_per_second'] / best['samples_per_second']:.1%} of the grid's best")
    for r in t.get("rows", []):
        print(f"   tune row {r['setting']} {r['micro_batch']} x {r['accum_steps']}: {r['status']} "
              f"{round(r.get('samples_per_second') or 0, 1)} {r.get('measured_in', '')} {r.get('note', '')[:80]}")
    for p in points:
        said = f"{p['samples_per_second']:.1f}" if p.get("ok") else ("OOM" if p.get("oom") else "failed")
        print(f"   grid {p['setting']} {p['micro_batch']} x {p['accum_steps']}: {said} ({p['wall_s']} s)")
EOF
(cd "$OUT" && tar --exclude='*.png' -czf /tmp/tune-targets.tgz . && find . -mindepth 1 -delete && mv /tmp/tune-targets.tgz all.tgz)
