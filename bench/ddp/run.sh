#!/usr/bin/env bash
# Data-parallel scaling of tapegrad (examples/ddp_train, MPI + NCCL) against PyTorch DDP
# (bench/ddp/torch_ddp.py, torchrun), at a fixed batch per GPU (weak scaling), on 1, 2 and 4
# GPUs of this host (those that exist), for two models (--model of both programs):
#   resnet  the ResNet-18-style GroupNorm net, batch 64 of 64x64 images per GPU: many small
#           kernels and 11 M parameters (several gradient buckets) per step;
#   conv_a  workload A's training step, Conv2d(64 -> 128, 3x3, no bias) on 8x64x512x1024 per
#           GPU with MSE and plain SGD: one large conv and a single 288 KiB gradient.
#
#   BUILD_DIR=build bench/ddp/run.sh            # a tree built with -DTG_CUDA=ON and MPI found
#
# Environment (all optional): BUILD_DIR (default build), OUT_DIR (default $BUILD_DIR/ddp_bench),
# MODELS ("resnet conv_a"), BATCH (resnet's batch per GPU, 64), SIZE (resnet's image size, 64),
# CONV_A_BATCH (8), CONV_A_SIZE (512: x is CONV_A_BATCH x 64 x 512 x 1024), STEPS (60),
# WARMUP (10), PRECISION (tf32), GPU_COUNTS ("1 2 4"), PYTHON (python3), MPIRUN (mpirun),
# RUN_TIMEOUT (seconds per launch, 900), CONTROL (1: on 2+ GPUs also time tapegrad with
# --no-sync, every rank training alone, which separates the slowest GPU's own pace from the
# cost of the gradient all-reduce; 0: skip it).
#
# Writes $OUT_DIR/results.jsonl (one JSON line per model, framework and GPU count), a log per
# launch, and $OUT_DIR/table.md, which it also prints: one table per model with the step time
# per framework, weak-scaling efficiency step_ms(1) / step_ms(N), and tapegrad's step time
# over PyTorch's.
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
MODELS="${MODELS:-resnet conv_a}"
BATCH="${BATCH:-64}"
SIZE="${SIZE:-64}"
CONV_A_BATCH="${CONV_A_BATCH:-8}"
CONV_A_SIZE="${CONV_A_SIZE:-512}"
STEPS="${STEPS:-60}"
WARMUP="${WARMUP:-10}"
PRECISION="${PRECISION:-tf32}"
GPU_COUNTS="${GPU_COUNTS:-1 2 4}"
PYTHON="${PYTHON:-python3}"
MPIRUN="${MPIRUN:-mpirun}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
CONTROL="${CONTROL:-1}"

for model in $MODELS; do
  if [[ "$model" != resnet && "$model" != conv_a ]]; then
    echo "error: MODELS: resnet and/or conv_a, got '$model'" >&2
    exit 1
  fi
done
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
echo "GPUs visible: $GPUS; models: $MODELS; $STEPS steps ($WARMUP warm-up), $PRECISION"
echo "resnet: batch $BATCH per GPU, ${SIZE}x${SIZE} images;" \
     "conv_a: x ${CONV_A_BATCH}x64x${CONV_A_SIZE}x$((2 * CONV_A_SIZE)) per GPU"
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
  for model in $MODELS; do
    # The options both programs take for the model; ddp_train's ResNet also reuses its first
    # batch (--data fixed), as torch_ddp.py does (conv_a's data are fixed in both).
    if [[ "$model" == resnet ]]; then
      model_args=(--model resnet --batch "$BATCH" --size "$SIZE")
      tapegrad_args=("${model_args[@]}" --data fixed)
    else
      model_args=(--model conv_a --batch "$CONV_A_BATCH" --size "$CONV_A_SIZE")
      tapegrad_args=("${model_args[@]}")
    fi
    # --bind-to none: torchrun does not pin its workers either, and a rank's host thread and
    # loader threads should not share one core. --log-every $STEPS: no loss read (a host
    # wait) inside the timed window but the last step's.
    run_one "$OUT_DIR/tapegrad_${model}_np$n.log" \
      "$MPIRUN" --allow-run-as-root --bind-to none -np "$n" \
      "${MPI_EXPORTS[@]}" \
      "$DDP_TRAIN" --device cuda "${tapegrad_args[@]}" --steps "$STEPS" \
      --warmup "$WARMUP" --precision "$PRECISION" --log-every "$STEPS" --json
    if [[ "$CONTROL" == 1 && "$n" -gt 1 ]]; then
      run_one "$OUT_DIR/tapegrad_${model}_np${n}_nosync.log" \
        "$MPIRUN" --allow-run-as-root --bind-to none -np "$n" \
        "${MPI_EXPORTS[@]}" \
        "$DDP_TRAIN" --device cuda "${tapegrad_args[@]}" --steps "$STEPS" \
        --warmup "$WARMUP" --precision "$PRECISION" --log-every "$STEPS" --json --no-sync
    fi
    run_one "$OUT_DIR/pytorch_${model}_np$n.log" \
      "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$n" "$HERE/torch_ddp.py" \
      "${model_args[@]}" --steps "$STEPS" --warmup "$WARMUP" --precision "$PRECISION"
  done
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
# Keyed by (model, framework, GPUs); a line without "model" predates conv_a: the ResNet.
# A --no-sync control line (no gradient all-reduce) counts as its own framework.
key = lambda r: (r.get("model", "resnet"), r["framework"] + ("-nosync" if r.get("no_sync") else ""),  # noqa: E731
                 r["gpus"])
step = {key(r): r["step_ms"] for r in rows}
ips = {key(r): r["images_per_s"] for r in rows}
first = {}  # the first result line per model: its shape fields head its table
for r in rows:
    first.setdefault(r.get("model", "resnet"), r)


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def eff(model, fw, n):
    # The no-sync control is measured against the synchronised 1-GPU step (one rank never communicates).
    one, this = step.get((model, fw.replace("-nosync", ""), 1)), step.get((model, fw, n))
    return None if one is None or this is None else one / this


def shape(r):
    if "input" in r:
        return "x " + "x".join(str(d) for d in r["input"]) + " per GPU"
    return f"batch {r['batch_per_rank']} per GPU, {r['size']}x{r['size']} images, width {r['width']}"


for model, r0 in first.items():
    counts = sorted({n for (m, _, n) in step if m == model})
    print(f"### {model}: {shape(r0)}, {r0['precision']}")
    print()
    print("| GPUs | tapegrad step ms | PyTorch step ms | tapegrad images/s | PyTorch images/s "
          "| tapegrad efficiency | PyTorch efficiency | tapegrad / PyTorch step time "
          "| tapegrad without all-reduce ms | its efficiency |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        t, p = step.get((model, "tapegrad", n)), step.get((model, "pytorch", n))
        ratio = None if t is None or p is None else t / p
        print(f"| {n} | {fmt(t, '.2f')} | {fmt(p, '.2f')} | {fmt(ips.get((model, 'tapegrad', n)), '.0f')} "
              f"| {fmt(ips.get((model, 'pytorch', n)), '.0f')} | {fmt(eff(model, 'tapegrad', n), '.1%')} "
              f"| {fmt(eff(model, 'pytorch', n), '.1%')} | {fmt(ratio, '.2f')} "
              f"| {fmt(step.get((model, 'tapegrad-nosync', n)), '.2f')} "
              f"| {fmt(eff(model, 'tapegrad-nosync', n), '.1%')} |")
    print()
print("Weak scaling: batch per GPU fixed, efficiency = step_ms(1 GPU) / step_ms(N GPUs) "
      "(100% = no cost from the gradient all-reduce). Ratio > 1: tapegrad is slower. Without all-reduce: "
      "ddp_train --no-sync, every rank training alone; its efficiency is the most any all-reduce could leave.")
EOF
echo
cat "$OUT_DIR/table.md"
echo "results: $RESULTS"
