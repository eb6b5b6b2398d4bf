#!/usr/bin/env bash
# Deviceless estimates against proven answers on one GPU, near the limit, in one call.
#
#   OUT=$OUT LIMIT_S=560 bash benchmarks/deviceless_x1.sh      (on the lent H200; carry .whl)
#
# 1. `jaxfit gpus capture` writes this card's own target config ($OUT/card.txtpb).
# 2. For each workload: the proven answer on the card (`jaxfit fit`, autotuned on both sides), and,
#    beside it on the host's CPU cores, the deviceless estimate for the same card from its captured
#    config (`jaxfit fit --gpu-spec`: the safe answer and the squeezed one), same fraction.
# NATIVE and DEVICELESS (space-separated workload names, default all) choose which sides run.
# Everything lands in $OUT/deviceless.tar.gz (the device tool brings back at most 8 files) and a
# summary in $OUT/summary.txt.
set -u
OUT=${OUT:?set OUT}
LIMIT=${LIMIT_S:-560}
source "$(dirname "$0")/gpu_env.sh"
RAW=$OUT/raw
mkdir -p "$RAW"
export JAXFIT_CACHE_DIR=/tmp/jaxfit-deviceless-cache WANDB_MODE=disabled PYTHONUNBUFFERED=1
jf() { python3 -m jaxfit.cli "$@"; }

jf version > "$RAW/version.txt" 2>&1
jf gpus capture --out "$OUT/card.txtpb" > "$RAW/capture.log" 2>&1 || { cat "$RAW/capture.log"; exit 1; }
cp "$OUT/card.txtpb" "$RAW/card.txtpb"

# name | fraction | what to fit (a built-in example, or --script -- COMMAND: last on the line)
WORKLOADS=(
  "gpt-small-f32|0.12|--example gpt-small"
  "gpt-small-bf16-remat|0.05|--example gpt-small --set dtype=bfloat16 --set remat=true"
  "vit-small-f32|0.06|--example vit-small"
  "vit-small-bf16|0.06|--example vit-small --set dtype=bfloat16"
  "gpt-medium-bf16-remat|0.15|--example gpt-medium-bf16-remat"
  "mlp-f32|0.03|--example mlp"
  "train-py-gpt-small|0.12|--script -- python3 scripts/train.py gpt_small --exp-name=dl --overwrite"
  "train-py-vit-small|0.06|--script -- python3 scripts/train.py vit_small --exp-name=dl --overwrite"
)

deviceless() {  # the deviceless side, on the CPU, beside the card's fits: two at a time
  local w name fraction args start
  for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r name fraction args <<< "$w"
    case " ${DEVICELESS:-$name} " in *" $name "*) ;; *) continue ;; esac
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do sleep 1; done
    ( start=$SECONDS
      # shellcheck disable=SC2086
      timeout $((LIMIT - SECONDS)) python3 -m jaxfit.cli fit --mem-fraction "$fraction" \
        --gpu-spec "$OUT/card.txtpb" --no-cache --json "$RAW/$name.deviceless.json" $args > "$RAW/$name.deviceless.log" 2>&1
      echo "$name deviceless exit $? in $((SECONDS - start)) s" >> "$RAW/sides.txt" ) &
  done
  wait
}
deviceless &
for w in "${WORKLOADS[@]}"; do
  IFS='|' read -r name fraction args <<< "$w"
  case " ${NATIVE:-$name} " in *" $name "*) ;; *) continue ;; esac
  left=$((LIMIT - SECONDS))
  if [ "$left" -lt 40 ]; then echo "$name native skipped: $left s left" >> "$RAW/sides.txt"; continue; fi
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout "$left" python3 -m jaxfit.cli fit --mem-fraction "$fraction" --no-cache \
    --json "$RAW/$name.native.json" $args > "$RAW/$name.native.log" 2>&1
  echo "$name native exit $? in $((SECONDS - start)) s" >> "$RAW/sides.txt"
done
wait
python3 - "$RAW" > "$OUT/summary.txt" <<'EOF'
import json, pathlib, sys
raw = pathlib.Path(sys.argv[1])
for native in sorted(raw.glob("*.native.json")):
    name = native.name[: -len(".native.json")]
    n = json.loads(native.read_text())
    d_path = raw / f"{name}.deviceless.json"
    d = json.loads(d_path.read_text()) if d_path.exists() else {}
    print(f"{name}: proven {n['batch_size']} (peak {n['peak_bytes']}, budget {n['budget_bytes']}); "
          f"deviceless safe {d.get('batch_size')}, squeezed {d.get('squeezed_batch_size')}")
EOF
cat "$RAW/sides.txt" "$OUT/summary.txt"
tar -czf "$OUT/deviceless.tar.gz" -C "$OUT" raw && rm -rf "$RAW"
