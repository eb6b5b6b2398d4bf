#!/usr/bin/env bash
# Section 19's fix, on a GPU: a card slightly larger than the GPU (80 GiB on an H100, which JAX
# counts as 79.18 GiB) runs under that card's limit, and a pinned program is not started in a pool
# smaller than its peak. About a minute on an H100:
#   OUT=$OUT bash benchmarks/check_card_pool.sh
# 1. card-run    jaxfit run --device-memory 80GiB --mem-fraction 0.9 --batch-size 8 (scripts/train.py
#                debug): its fraction (0.909 on an H100) and the bytes_limit the run prints (0.9 x
#                80 GiB = 77,309,411,328 B);
# 2. pin-fit     jaxfit fit --script --min-batch 8 --max-batch 8 (one autotuned compile): the pin and its peak;
# 3. pin-short   that pin run by hand with the fit's environment but a fraction whose pool is half
#                the proven peak: exit 76 and one line, before the first step.
set -uo pipefail
OUT=${OUT:-/tmp/card-pool}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
export JAXFIT_CACHE_DIR=/tmp/card-pool-cache WANDB_MODE=disabled
unset XLA_PYTHON_CLIENT_MEM_FRACTION XLA_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR
train=(python3 scripts/train.py debug --no-wandb-enabled --num-train-steps=2 --log-interval=1 --overwrite
  --checkpoint-base-dir=/tmp/card-pool-ck)

echo "== card-run"
timeout 120 python3 -m jaxfit.cli run --device-memory 80GiB --mem-fraction 0.9 --batch-size 8 \
  --json "$OUT/card-run.json" -- "${train[@]}" --exp-name=card >"$OUT/card-run.log" 2>&1
echo "exit $?"
grep -E "XLA_PYTHON_CLIENT_MEM_FRACTION=|bytes_limit=|jaxfit: error" "$OUT/card-run.log" | head -5

echo "== pin-fit"
timeout 150 python3 -m jaxfit.cli fit --script --mem-fraction 0.3 --min-batch 8 --max-batch 8 --json "$OUT/pin-fit.json" \
  -- "${train[@]}" --exp-name=fit >"$OUT/pin-fit.log" 2>&1
echo "exit $?"

echo "== pin-short"
python3 - "$OUT" "${train[@]}" --checkpoint-base-dir=/tmp/card-pool-ck2 --exp-name=short <<'EOF'
import json, os, subprocess, sys
out, train = sys.argv[1], sys.argv[2:]
fit = json.load(open(f"{out}/pin-fit.json"))
total = fit["device"]["gpu_total_bytes"]
low = 0.5 * fit["peak_bytes"] / total
env = dict(os.environ)
env.update(fit["env"])
env["PYTHONPATH"] = fit["env"]["PYTHONPATH"] + os.pathsep + os.environ.get("PYTHONPATH", "")
env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{low:.6f}"
proc = subprocess.run([*train, f"--batch-size={fit['batch_size']}"], env=env, capture_output=True, text=True, timeout=120)
open(f"{out}/pin-short.log", "w").write(proc.stdout + proc.stderr)
errors = [l for l in proc.stderr.splitlines() if l.startswith("jaxfit: error:")]
print(json.dumps({"peak_bytes": fit["peak_bytes"], "fraction": low, "exit": proc.returncode, "errors": errors,
                  "stepped": "step 1" in proc.stdout}, indent=1))
EOF
tar -czf "$OUT/all.tgz" -C "$OUT" --exclude=all.tgz . 2>/dev/null
