#!/usr/bin/env bash
# Data-parallel scaling of tapegrad (examples/ddp_train, MPI + NCCL) against PyTorch DDP
# (bench/ddp/torch_ddp.py, torchrun) on the ResNet-18-style GroupNorm net, at a fixed batch per
# GPU (weak scaling), on 1, 2 and 4 GPUs of this host (those that exist).
#
#   BUILD_DIR=build bench/ddp/run.sh            # a tree built with -DTG_CUDA=ON and MPI found
#
# Environment (all optional): BUILD_DIR (default build), OUT_DIR (default $BUILD_DIR/ddp_bench),
# BATCH (64, per GPU), SIZE (64), STEPS (60), WARMUP (10), PRECISION (tf32), GPU_COUNTS ("1 2 4"),
# PYTHON (python3), MPIRUN (mpirun), RUN_TIMEOUT (seconds per launch, 900).
#
# Writes $OUT_DIR/results.jsonl (one JSON line per framework and GPU count), a log per launch,
# and $OUT_DIR/table.md, which it also prints: step time per framework, weak-scaling
# efficiency step_ms(1) / step_ms(N), and tapegrad's step time over PyTorch's.
#
# NVLink SHARP multicast stays off for every launched process: these three variables are
# exported here and passed by mpirun -x to every rank (torchrun's workers inherit them).
set -euo pipefail

export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
OUT_DIR="${OUT_DIR:-$BUILD_DIR/ddp_bench}"
BATCH="${BATCH:-64}"
SIZE="${SIZE:-64}"
STEPS="${STEPS:-60}"
WARMUP="${WARMUP:-10}"
PRECISION="${PRECISION:-tf32}"
GPU_COUNTS="${GPU_COUNTS:-1 2 4}"
PYTHON="${PYTHON:-python3}"
MPIRUN="${MPIRUN:-mpirun}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"

DDP_TRAIN="$BUILD_DIR/examples/ddp_train"
if [[ ! -x "$DDP_TRAIN" ]]; then
  echo "error: $DDP_TRAIN not found: build the tree with CUDA and MPI (target ddp_train) first" >&2
  exit 1
fi
if command -v nvidia-smi > /dev/null; then
  GPUS="$(nvidia-smi -L | grep -c '^GPU ' || true)"
else
  GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')"
fi
if [[ "$GPUS" -lt 1 ]]; then
  echo "error: no GPU visible" >&2
  exit 1
fi

mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: > "$RESULTS"
echo "GPUs visible: $GPUS; batch $BATCH per GPU, ${SIZE}x${SIZE}, $STEPS steps ($WARMUP warm-up), $PRECISION"
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST" \
     "NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"

# Runs a launch command, keeping its output in $1 (a log file), and appends its JSON result
# line to $RESULTS. A failed launch is reported and skipped: the table shows a gap.
run_one() {
  local log="$1"
  shift
  echo "+ $*" | tee "$log"
  local rc=0
  timeout "$RUN_TIMEOUT" "$@" >> "$log" 2>&1 || rc=$?
  local line
  line="$(grep '^{"framework"' "$log" | tail -n 1 || true)"
  if [[ $rc -ne 0 || -z "$line" ]]; then
    echo "  FAILED (exit $rc); the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    return 0
  fi
  echo "  $line"
  echo "$line" >> "$RESULTS"
}

# mpirun -x warns about a variable that is not set: pass only those that are.
MPI_EXPORTS=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PATH)
for v in LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES TG_DIST_TIMEOUT; do
  if [[ -n "${!v+set}" ]]; then MPI_EXPORTS+=(-x "$v"); fi
done

for n in $GPU_COUNTS; do
  if [[ "$n" -gt "$GPUS" ]]; then
    echo "skipping $n GPUs: only $GPUS visible"
    continue
  fi
  # --bind-to none: torchrun does not pin its workers either, and a rank's host thread and
  # loader threads should not share one core. --log-every $STEPS: no loss read (a host
  # wait) inside the timed window but the last step's.
  run_one "$OUT_DIR/tapegrad_np$n.log" \
    "$MPIRUN" --allow-run-as-root --bind-to none -np "$n" \
    "${MPI_EXPORTS[@]}" \
    "$DDP_TRAIN" --device cuda --batch "$BATCH" --size "$SIZE" --steps "$STEPS" --warmup "$WARMUP" \
    --precision "$PRECISION" --data fixed --log-every "$STEPS" --json
  run_one "$OUT_DIR/pytorch_np$n.log" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$n" "$HERE/torch_ddp.py" \
    --batch "$BATCH" --size "$SIZE" --steps "$STEPS" --warmup "$WARMUP" --precision "$PRECISION"
done

"$PYTHON" - "$RESULTS" > "$OUT_DIR/table.md" <<'EOF'
import json
import sys

rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        print(f"skipping a line that is not JSON: {line.strip()}", file=sys.stderr)
step = {(r["framework"], r["gpus"]): r["step_ms"] for r in rows}
ips = {(r["framework"], r["gpus"]): r["images_per_s"] for r in rows}
counts = sorted({r["gpus"] for r in rows})


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def eff(fw, n):
    one, this = step.get((fw, 1)), step.get((fw, n))
    return None if one is None or this is None else one / this


print("| GPUs | tapegrad step ms | PyTorch step ms | tapegrad images/s | PyTorch images/s "
      "| tapegrad efficiency | PyTorch efficiency | tapegrad / PyTorch step time |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in counts:
    t, p = step.get(("tapegrad", n)), step.get(("pytorch", n))
    ratio = None if t is None or p is None else t / p
    print(f"| {n} | {fmt(t, '.2f')} | {fmt(p, '.2f')} | {fmt(ips.get(('tapegrad', n)), '.0f')} "
          f"| {fmt(ips.get(('pytorch', n)), '.0f')} | {fmt(eff('tapegrad', n), '.1%')} "
          f"| {fmt(eff('pytorch', n), '.1%')} | {fmt(ratio, '.2f')} |")
print()
print("Weak scaling: batch per GPU fixed, efficiency = step_ms(1 GPU) / step_ms(N GPUs) "
      "(100% = no cost from the gradient all-reduce). Ratio > 1: tapegrad is slower.")
EOF
echo
cat "$OUT_DIR/table.md"
echo "results: $RESULTS"
