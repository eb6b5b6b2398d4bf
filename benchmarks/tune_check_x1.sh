#!/usr/bin/env bash
# Issue 21 on one GPU, in one call: jaxfit tune (inline measuring, preallocated compile process)
# for gpt-small bf16 (global batch 64, fraction 0.0706) and vit-small fp32 (global batch 128,
# fraction 0.03), and, on the same card, fresh training processes at the grid points that won in
# section 17's 4-GPU call, to compare inline rates with fresh-process ones.
#   OUT=$OUT bash benchmarks/tune_check_x1.sh
set -uo pipefail
OUT=${OUT:-/tmp/tune-x1}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
gpt=(run --example gpt-small --global-batch 64 --fraction 0.0706 --precision bfloat16)
vit=(run --example vit-small --global-batch 128 --fraction 0.03 --precision float32)
# Every step ends by LIMIT_S (default 540 s), so the archive is always made inside the call's limit
# (a call cut by its own limit brings back 8 loose files: the first run of this script lost its
# tune results that way), and each step's summary is printed as soon as it ends.
LIMIT=${LIMIT_S:-540}
b() {
  local name=$1 left=$((LIMIT - SECONDS))
  shift
  mkdir -p "$OUT/$name"
  if [ "$left" -lt 30 ]; then echo "$name skipped: $left s left" | tee -a "$OUT/sides.txt"; return; fi
  timeout "$((left < 300 ? left : 300))" python3 benchmarks/bench_tune.py "$@" --out "$OUT/$name" >"$OUT/$name/bench.log" 2>&1
  echo "$name exit $? at $SECONDS s" | tee -a "$OUT/sides.txt"
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); t=r.get("tune") or {}; print("  wall", r.get("tune_wall_s"), t.get("phase_seconds")); [print("  ", x["setting"], x["micro_batch"], "x", x["accum_steps"], x["status"], round(x.get("samples_per_second") or 0, 1), x.get("measured_in"), x.get("note", "")[:90]) for x in t.get("rows", [])]; [print("   fresh", p["setting"], p["micro_batch"], "x", p["accum_steps"], round(p.get("samples_per_second") or 0, 1), p["wall_s"]) for p in r.get("grid", [])]' "$OUT/$name/raw.jsonl" 2>/dev/null
}
b gpt-tune "${gpt[@]}" --remat none,full --skip-grid
b gpt-fresh-none "${gpt[@]}" --remat none --skip-tune --grid-micro 4
b gpt-fresh-full "${gpt[@]}" --remat full --skip-tune --grid-micro 8
b vit-tune "${vit[@]}" --remat none,full --skip-grid
b vit-fresh-full "${vit[@]}" --remat full --skip-tune --grid-micro 128,64
(cd "$OUT" && tar --exclude='*.png' -czf /tmp/tune-x1.tgz . && find . -mindepth 1 -delete && mv /tmp/tune-x1.tgz all.tgz)
