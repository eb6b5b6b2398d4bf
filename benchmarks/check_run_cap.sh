#!/usr/bin/env bash
# Issue 22, item 3, on a GPU: is the memory fraction a hard cap in every process jaxfit starts, and
# is a process that does not hold it refused? One call, about two minutes on an H100:
#   OUT=$OUT bash benchmarks/check_run_cap.sh
# Cases (each: its command, exit code, jaxfit's error line, the allocator limit the run printed):
#   fit / fit-platform            the compile process's limit against fraction x the GPU's total
#   run / run-new-spelling        jaxfit run at a given batch and fraction: the run holds its pool
#   run-pinned                    fit + pinned run (the check and the pin together)
#   run-platform                  a run whose fraction is no cap: refused before its first step
#   run-both                      both spellings in the shell: the run gets only the one jaxfit sets
#   schedule / schedule-platform  two runs side by side; the same with XLA_PYTHON_CLIENT_ALLOCATOR=platform
# Writes $OUT/cases.jsonl and the logs; prints a table.
set -uo pipefail
OUT=${OUT:-/tmp/run-cap}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
export JAXFIT_CACHE_DIR=/tmp/run-cap-cache WANDB_MODE=disabled
unset XLA_PYTHON_CLIENT_MEM_FRACTION XLA_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR
TOTAL=$(python3 -c "
import os; os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']='1.0'; os.environ['XLA_PYTHON_CLIENT_PREALLOCATE']='false'
import jax; print(jax.devices()[0].memory_stats()['bytes_limit'])")
echo "CUDA total as JAX counts it (bytes_limit at fraction 1.0): $TOTAL" | tee "$OUT/total.txt"
train=(python3 scripts/train.py debug --no-wandb-enabled --num-train-steps=3 --log-interval=1 --overwrite
  --checkpoint-base-dir=/tmp/run-cap-ck)

one() {  # NAME EXPECTED_EXIT ENV... -- ARGS...
  local name=$1 expected=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local start=$SECONDS
  env "${envs[@]}" timeout 300 "$@" >"$OUT/$name.log" 2>&1
  local code=$?
  python3 - "$OUT" "$name" "$expected" "$code" "$((SECONDS - start))" "$TOTAL" "${envs[*]}" "$*" <<'EOF'
import json, re, sys
out, name, expected, code, seconds, total, envs, command = sys.argv[1:]
text = open(f"{out}/{name}.log", errors="replace").read()
errors = [l for l in text.splitlines() if l.startswith("jaxfit: error:")]
limits = [int(m) for m in re.findall(r"bytes_limit=(\d+)", text)]
row = {"case": name, "expected_exit": int(expected), "exit": int(code), "ok": int(expected) == int(code),
       "seconds": int(seconds), "env": envs, "command": command, "error": errors[-1] if errors else None,
       "run_bytes_limit": limits[-1] if limits else None, "gpu_total_bytes": int(total),
       "pinned": "runs the program jaxfit proved" in text}
with open(f"{out}/cases.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
print(f"{name:18} exit {code} (expected {expected}) {'OK ' if row['ok'] else 'BAD'} {seconds}s "
      f"limit={row['run_bytes_limit']} {(row['error'] or '')[:160]}", flush=True)
EOF
}
J=(python3 -m jaxfit.cli)
one fit 0 A=1 -- "${J[@]}" fit --example gpt-small --mem-fraction 0.3 --json "$OUT/fit.json"
one fit-platform 2 XLA_PYTHON_CLIENT_ALLOCATOR=platform -- "${J[@]}" fit --example gpt-small --mem-fraction 0.3
one run 0 A=1 -- "${J[@]}" run --batch-size 8 --mem-fraction 0.3 -- "${train[@]}" --exp-name=a
one run-new-spelling 0 XLA_CLIENT_MEM_FRACTION=0.5 -- "${J[@]}" run --batch-size 8 --mem-fraction 0.3 -- "${train[@]}" --exp-name=b
one run-pinned 0 A=1 -- "${J[@]}" run --mem-fraction 0.3 --max-batch 64 -- "${train[@]}" --exp-name=c
one run-platform 76 XLA_PYTHON_CLIENT_ALLOCATOR=platform -- "${J[@]}" run --batch-size 8 --mem-fraction 0.3 -- "${train[@]}" --exp-name=d
one run-both 0 XLA_CLIENT_MEM_FRACTION=0.3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 -- "${J[@]}" run --batch-size 8 --mem-fraction 0.3 -- "${train[@]}" --exp-name=e
mkdir -p /tmp/run-cap-q
cat >/tmp/run-cap-q/queue.yaml <<EOF
experiments:
  - {name: s1, command: [python3, $REPO/scripts/train.py, debug, --exp-name=s1, --no-wandb-enabled, --num-train-steps=3, --overwrite, --checkpoint-base-dir=/tmp/run-cap-ck], batch: 8, fraction: 0.3}
  - {name: s2, command: [python3, $REPO/scripts/train.py, debug, --exp-name=s2, --no-wandb-enabled, --num-train-steps=3, --overwrite, --checkpoint-base-dir=/tmp/run-cap-ck], batch: 8, fraction: 0.3}
EOF
one schedule 0 A=1 -- bash -c "cd /tmp/run-cap-q && ${J[*]} schedule queue.yaml --json $OUT/schedule.json --state-dir $OUT/schedule-state --quiet"
one schedule-platform 1 XLA_PYTHON_CLIENT_ALLOCATOR=platform -- bash -c "cd /tmp/run-cap-q && ${J[*]} schedule queue.yaml --json $OUT/schedule-platform.json --state-dir $OUT/schedule-platform-state --quiet"
cp /tmp/run-cap-q/queue.yaml "$OUT/queue.yaml"
for f in "$OUT"/schedule*-state/logs/*.log; do [ -f "$f" ] && grep -h "bytes_limit=\|jaxfit: error" "$f" | sed "s|^|$(basename "$f"): |"; done | tee "$OUT/schedule-limits.txt"
python3 -c "
import json; rows=[json.loads(l) for l in open('$OUT/cases.jsonl')]
print(sum(r['ok'] for r in rows), 'of', len(rows), 'cases as expected')"
# a device call brings back at most 8 files: everything else travels in one archive
(cd "$OUT" && tar czf /tmp/run-cap-all.tgz --exclude=all.tgz . && mv /tmp/run-cap-all.tgz all.tgz &&
  find . -mindepth 1 -maxdepth 1 ! -name all.tgz ! -name cases.jsonl -exec rm -rf {} +)
