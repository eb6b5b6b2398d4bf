#!/usr/bin/env bash
# Issue 13's GPU measurements on one host with 4 GPUs, in phases of at most ~570 s (one `run` call
# each; the device tool allows 600 s a call). Jobs on disjoint GPUs run side by side.
#
#   bash benchmarks/mesh_x4.sh a $OUT  # GPUs 0,1: train.py FSDP 2 answer, and the example's real 2-GPU
#                                      # cells beside it; GPU 2: its mocked 2-GPU cells; GPU 3: mocked 4-GPU
#   bash benchmarks/mesh_x4.sh b $OUT  # GPUs 0-3: train.py FSDP 4 and data-parallel answers side by side,
#                                      # and the real 4-GPU cells beside them
#   bash benchmarks/mesh_x4.sh c $OUT  # what a and b left: the FSDP 2 answer and cells with wider
#                                      # windows (a's sat at the window's top), the 4-GPU answers again
#                                      # in windows around b's rounds, the mocked FSDP 4 cell widened
#
# The what-if cells are untuned compiles (--no-verify): no autotuning, so the program is a pure
# function of the topology and a mocked topology can be compared with the real one byte for byte.
# They only compile (a GPU client each, no training), so they share GPUs with an answer's run:
# that run's fraction (0.25) plus a compile process's leave most of each 80 GB card free, and the
# run's own numbers (its pool, its peak) are its process's alone.
#
# The batch windows (--min-batch/--max-batch) keep each fit to a few rounds; they are wide enough
# to hold the boundary found on two H100s (data parallel: 34 global, 17 per device) and what FSDP
# frees. An answer at a window's edge says the window was wrong, and the table shows it.
set -u
phase=$1
out=$2/x4
mkdir -p "$out"
B="python3 benchmarks/bench_mesh.py"
M="--config gpt_medium_bf16_remat --fraction 0.25"
E="--example gpt-medium-bf16-remat --fraction 0.25"
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$out/gpus-$phase.csv" 2>&1
case $phase in
a)
    CUDA_VISIBLE_DEVICES=0,1 $B answers --out "$out/answers-2" $M --fsdp 2 --min-batch 32 --max-batch 64 \
        --timeout 360 --next-timeout 170 >"$out/a-answers.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0,1 $B whatif --only real --out "$out/real-2" $E --devices 2 --fsdp 2 1 \
        --min-batch 32 --max-batch 64 --no-verify --timeout 265 >"$out/a-real2.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=2 $B whatif --only mock --out "$out/mock-2" $E --devices 2 --fsdp 2 1 \
        --min-batch 32 --max-batch 64 --no-verify --timeout 265 >"$out/a-mock2.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=3 $B whatif --only mock --out "$out/mock-4" $E --devices 4 --fsdp 4 1 \
        --min-batch 64 --max-batch 128 --no-verify --timeout 265 >"$out/a-mock4.log" 2>&1 &
    ;;
b)
    CUDA_VISIBLE_DEVICES=0,1,2,3 $B answers --out "$out/answers-4" $M --fsdp 4 --min-batch 128 --max-batch 192 \
        --timeout 330 --next-timeout 170 >"$out/b-answers-fsdp4.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0,1,2,3 $B answers --out "$out/answers-4dp" $M --fsdp 1 --min-batch 64 --max-batch 96 \
        --timeout 330 --next-timeout 170 >"$out/b-answers-dp.log" 2>&1 &
    (
        CUDA_VISIBLE_DEVICES=0,1,2,3 $B whatif --only real --out "$out/real-4" $E --devices 4 --fsdp 4 \
            --min-batch 128 --max-batch 512 --no-verify --timeout 265
        CUDA_VISIBLE_DEVICES=0,1,2,3 $B whatif --only real --out "$out/real-4" $E --devices 4 --fsdp 1 \
            --min-batch 64 --max-batch 96 --no-verify --timeout 265
    ) >"$out/b-real4.log" 2>&1 &
    ;;
c)
    CUDA_VISIBLE_DEVICES=0,1 $B answers --out "$out/answers-2w" $M --fsdp 2 --min-batch 64 --max-batch 96 \
        --timeout 380 --next-timeout 150 >"$out/c-answers-fsdp2.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0,1,2,3 $B answers --out "$out/answers-4dp" $M --fsdp 1 --min-batch 64 --max-batch 72 \
        --timeout 380 --next-timeout 150 >"$out/c-answers-dp4.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0,1,2,3 $B answers --out "$out/answers-4" $M --fsdp 4 --min-batch 128 --max-batch 148 \
        --timeout 380 --next-timeout 150 >"$out/c-answers-fsdp4.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=2,3 $B whatif --only real --out "$out/real-2w" $E --devices 2 --fsdp 2 \
        --min-batch 64 --max-batch 256 --no-verify --timeout 300 >"$out/c-real2.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=2 $B whatif --only mock --out "$out/mock-2w" $E --devices 2 --fsdp 2 \
        --min-batch 64 --max-batch 256 --no-verify --timeout 300 >"$out/c-mock2.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=3 $B whatif --only mock --out "$out/mock-4w" $E --devices 4 --fsdp 4 \
        --min-batch 128 --max-batch 512 --no-verify --timeout 300 >"$out/c-mock4.log" 2>&1 &
    ;;
*)
    echo "phase must be a, b or c" >&2
    exit 2
    ;;
esac
wait
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >"$out/left-running-$phase.csv" 2>&1
$B table "$out"/*/ 2>&1 | tee "$out/table-$phase.md"
# The device tool brings back only a few files: everything goes back as one archive.
tar czf "$2/x4-$phase.tgz" -C "$2" x4 && rm -rf "$out"
