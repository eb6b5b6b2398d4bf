#!/usr/bin/env bash
# Reruns each case of the fourth faults audit (pins as code, a queue's env, signals, unbounded
# input, wrong advice) from the command line, on a CPU, and prints one row per case: its name,
# the exit code, and the last line jaxfit (or the training process) printed.
#
#   bash benchmarks/faults_round4.sh > benchmarks/results/cpu/faults-round4.txt
#
# Everything is written in a temporary folder (its own cache, TMPDIR and pins); run from a clone.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export JAXFIT_CACHE_DIR="$work/cache" TMPDIR="$work/tmp" JAX_PLATFORMS=cpu WANDB_MODE=offline WANDB_SILENT=true
mkdir -p "$TMPDIR"
py=${PYTHON:-python}
train="$repo/scripts/train.py"
mini="$repo/tests/fixtures/mini_train.py"
probe=$("$py" -c "from jaxfit.fit.command import PROBE_DIR; print(PROBE_DIR)")

row() {  # row NAME CMD...: the exit code and the last line printed
    local name=$1
    shift
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    printf '%s | exit %s | %s\n' "$name" "$rc" "$(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1 | cut -c1-400)"
}

echo "# jaxfit $("$py" -m jaxfit.cli --version) on $(uname -m), $(nproc) cores, $(date -u +%Y-%m-%d)"

# 1. A pin is code: a forged executable with a matching size and SHA-256 in pin.json.
"$py" -m jaxfit.cli fit --example mlp-tiny --device-memory 8MiB --mem-fraction 0.5 --quiet --json fit.json >/dev/null 2>&1
pin=$("$py" -c "import json; print(json.load(open('fit.json'))['pin']['path'])")
"$py" - "$pin" "$work/PWNED" <<'EOF'
import hashlib, json, os, pickle, sys
pin, marker = sys.argv[1:]
class P:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))
forged = pickle.dumps(P())
folder = os.path.dirname(pin)
open(os.path.join(folder, "executable.bin"), "wb").write(forged)
data = json.load(open(pin))
data.update(executable_bytes=len(forged), executable_sha256=hashlib.sha256(forged).hexdigest())
json.dump(data, open(pin, "w"))
EOF
row "1a forged executable" env PYTHONPATH="$probe" JAXFIT_PIN="$pin" "$py" -c "import jax; print('trained')"
echo "1a payload ran: $([ -e "$work/PWNED" ] && echo YES || echo no)"
mkdir -p "$TMPDIR/jaxfit-pins-$(id -u)" && chmod 0777 "$TMPDIR/jaxfit-pins-$(id -u)"
if [ "$(id -u)" = 0 ]; then chown 12345 "$TMPDIR/jaxfit-pins-$(id -u)"; fi
row "1b --no-cache, pins folder another user's, mode 0777" "$py" -m jaxfit.cli fit --example mlp-tiny --device-memory 8MiB --mem-fraction 0.5 --no-cache --quiet --json nc.json
"$py" -c "import json; print('1b pin:', json.load(open('nc.json'))['pin'], '|', json.load(open('nc.json'))['message'][-160:])"
rm -rf "$TMPDIR/jaxfit-pins-$(id -u)"
row "1c unwritable TMPDIR" env TMPDIR=/proc/nosuch "$py" -m jaxfit.cli fit --example mlp-tiny --device-memory 8MiB --mem-fraction 0.5 --no-cache --quiet --json nt.json
"$py" -c "import json; print('1c pin:', json.load(open('nt.json'))['pin'], '|', json.load(open('nt.json'))['message'][-160:])"

# 2. A queue's env may not undo what the scheduler sets.
for kv in "PYTHONPATH: /tmp/elsewhere" "CUDA_VISIBLE_DEVICES: '3'" "XLA_PYTHON_CLIENT_PREALLOCATE: 'false'" "JAXFIT_PIN: /tmp/x/pin.json" "JAX_PLATFORMS: cuda"; do
    printf 'gpus: 1\ndevice_memory: 1GiB\nexperiments:\n  - name: a\n    command: [python, %s, debug, --exp-name=a]\n    env: {%s}\n' "$train" "$kv" > q.yaml
    if [ "${kv%%:*}" = PYTHONPATH ]; then  # a real run (batch and fraction given: no probe) prints its PYTHONPATH
        printf 'gpus: 1\ndevice_memory: 1GiB\nreserve: 0\nprocess_overhead: 0\nexperiments:\n  - name: a\n    command: [%s, -c, "import os; open(%s, \x27w\x27).write(os.environ[\x27PYTHONPATH\x27])"]\n    batch: 8\n    fraction: 0.1\n    env: {%s}\n' "$py" "'$work/pythonpath.txt'" "$kv" > q.yaml
        row "2 env PYTHONPATH: /tmp/elsewhere (a real run)" "$py" -m jaxfit.cli schedule q.yaml --quiet
        echo "2 the run's PYTHONPATH: $(cat "$work/pythonpath.txt" 2>/dev/null)"
    else
        row "2 env ${kv%%:*}" "$py" -m jaxfit.cli schedule q.yaml --dry-run --quiet
    fi
done

# 3. A pin made for another program, under a far smaller fraction.
row "3 foreign pin under 1e-6" env PYTHONPATH="$probe" JAXFIT_PIN="$(cd "$work" && "$py" -m jaxfit.cli fit --example mlp-tiny --device-memory 64MiB --mem-fraction 0.5 --quiet --json f.json >/dev/null 2>&1; "$py" -c "import json; print(json.load(open('f.json'))['pin']['path'])")" XLA_PYTHON_CLIENT_MEM_FRACTION=0.000001 "$py" "$mini" --batch-size 64 --steps 1

# 4. run --grace: a script that traps SIGTERM, jaxfit under timeout -k.
cat > traps.py <<'EOF'
import signal, time
signal.signal(signal.SIGTERM, lambda *a: print("trapped SIGTERM, writing a last checkpoint", flush=True))
print("jaxfit_grace_marker training", flush=True)
time.sleep(600)
EOF
start=$(date +%s)
row "4a run --grace 2, SIGTERM after 8 s" timeout -s TERM 8 "$py" -m jaxfit.cli run --mem-fraction 0.1 --batch-size 1 --grace 2 -- "$py" traps.py
echo "4a took $(( $(date +%s) - start )) s; left running: $(pgrep -fc jaxfit_grace_marker || true)"
row "4b jaxfit SIGKILLed (timeout -k 1 -s KILL 8)" timeout -s KILL 8 "$py" -m jaxfit.cli run --mem-fraction 0.1 --batch-size 1 -- "$py" traps.py
sleep 2
echo "4b training processes left (PPID 1): $(pgrep -fc jaxfit_grace_marker || true)"

# 5. Unbounded numbers and duplicate keys.
big=99999999999999999999
row "5a run --global-batch $big" timeout 60 "$py" -m jaxfit.cli run --global-batch $big -- "$py" "$train" debug --exp-name=x
row "5b tune --global-batch $big" timeout 60 "$py" -m jaxfit.cli tune --global-batch $big
printf 'gpus: 1\ndevice_memory: 1GiB\nexperiments:\n  - name: a\n    command: [python, x.py]\n    fraction: 0.1\n    batch: %s\n' $big > qb.yaml
row "5c queue batch: $big" "$py" -m jaxfit.cli schedule qb.yaml --dry-run --quiet
printf 'gpus: 1\ndevice_memory: 1GiB\nexperiments:\n  - name: a\n    command: [python, x.py]\n    global_batch: %s\n' $big > qg.yaml
row "5d queue global_batch: $big" "$py" -m jaxfit.cli schedule qg.yaml --dry-run --quiet
printf 'gpus: 1\nexperiments:\n  - name: a\n    name: b\n    command: [python, x.py]\n' > qd.yaml
row "5e YAML duplicate key" "$py" -m jaxfit.cli schedule qd.yaml --dry-run --quiet

# 6-9.
row "6 tune --example mlp-tiny" timeout 600 "$py" -m jaxfit.cli tune --example mlp-tiny --device-memory 64MiB --mem-fraction 0.5 --quiet
row "7 JAX_PLATFORMS=cuda, no GPU here" env JAX_PLATFORMS=cuda "$py" -m jaxfit.cli fit --example mlp-tiny
: > cache-is-a-file
row "8 JAXFIT_CACHE_DIR is a file" env JAXFIT_CACHE_DIR="$work/cache-is-a-file" "$py" -m jaxfit.cli fit --example mlp-tiny --device-memory 8MiB --mem-fraction 0.5 --quiet --json c8.json
"$py" -c "import json; d = json.load(open('c8.json')); print('8 pin:', (d['pin'] or {}).get('path'), '|', d['message'][-120:])"
row "9 tune --axis=--remat=none,full with --remat=dots" "$py" -m jaxfit.cli tune --script --axis=--remat=none,full -- "$py" "$train" debug --exp-name=t --remat=dots

# The advice table.
row "A1 fit --mem-fraction 1e-12" "$py" -m jaxfit.cli fit --example mlp-tiny --mem-fraction 1e-12
# (a read-only folder: /proc, which root cannot write either)
row "A2 plan --markdown /proc/hw.md (a read-only folder)" "$py" -m jaxfit.cli plan --example gpt-tiny --markdown /proc/hw.md
row "A3 run --batch-flag '--bs;touch X'" "$py" -m jaxfit.cli run --batch-flag '--bs;touch X' -- "$py" "$mini"
mkdir -p cal.XXXX
row "A4 calibrate --json FOLDER" "$py" -m jaxfit.cli calibrate --json cal.XXXX
printf 'import argparse, time\nargparse.ArgumentParser().parse_known_args()\ntime.sleep(60)\nimport jax\n' > slow.py
row "A5 fit --script --probe-timeout 4 (still importing)" "$py" -m jaxfit.cli fit --script --probe-timeout 4 -- "$py" slow.py --batch-size=8
row "A6 plan --card 24GB=24GiB (a default card's name)" "$py" -m jaxfit.cli plan --example gpt-tiny --card 24GB=24GiB
printf 'gpus: 1\ndevice_memory: 1GiB\nexperiments:\n  - name: a\n    command: [python, %s, debug, --exp-name=a]\n' "$train" > qr.yaml
row "A7 schedule --resume with no state written" "$py" -m jaxfit.cli schedule qr.yaml --resume --state-dir nothing-here
row "A8 run --dry-run --json: env carries the pin" "$py" -m jaxfit.cli run --device-memory 64MiB --mem-fraction 0.5 --max-batch 64 --dry-run --quiet --json plan.json -- "$py" "$mini" --steps 1
"$py" -c "import json; d = json.load(open('plan.json')); print('A8 env JAXFIT_PIN is the pin:', d['env'].get('JAXFIT_PIN') == (d.get('pin') or {}).get('path') and bool(d['env'].get('JAXFIT_PIN')))"
