#!/usr/bin/env bash
# CUDA-graphed training steps beside PyTorch, on one GPU, in one run: the cnn example's model
# and the ResNet-18-style GroupNorm net at small batches, each as tapegrad eager, tapegrad
# graphed (tg::cuda::GraphedStep), PyTorch eager and PyTorch graphed (torch.cuda.graph), plus
# the host's cost per op launch, tape (autograd) record and backward entry of both, and the
# cost of tapegrad's profiler on the eager step (off, recording, stopped, off again).
#
#   BUILD_DIR=build bench/graphs/run.sh        # a tree built with -DTG_CUDA=ON (target tg_graphs)
#
# Environment (all optional): BUILD_DIR (default build), OUT_DIR (default
# $BUILD_DIR/graphs_bench), MODELS (cnn,resnet), BATCHES (8,32), STEPS (200), WARMUP (20),
# SIZE (resnet's image size, 32), WIDTH (resnet's width, 64), PRECISION (fp32), PYTHON
# (python3), RUN_TIMEOUT (seconds per program, 900).
#
# Both programs check the graphed step against the eager one before timing; tg_graphs stops
# with exit status 1 if the parameters differ at all, and this script then fails too (no
# table). Writes $OUT_DIR/results.jsonl, a log per program, and $OUT_DIR/table.md, which it
# also prints.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
OUT_DIR="${OUT_DIR:-$BUILD_DIR/graphs_bench}"
MODELS="${MODELS:-cnn,resnet}"
BATCHES="${BATCHES:-8,32}"
STEPS="${STEPS:-200}"
WARMUP="${WARMUP:-20}"
SIZE="${SIZE:-32}"
WIDTH="${WIDTH:-64}"
PRECISION="${PRECISION:-fp32}"
PYTHON="${PYTHON:-python3}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"

TG_GRAPHS="$BUILD_DIR/bench/tg_graphs"
if [[ ! -x "$TG_GRAPHS" ]]; then
  echo "error: $TG_GRAPHS not found: build the tree with CUDA (target tg_graphs) first" >&2
  exit 1
fi
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: > "$RESULTS"
COMMON=(--models "$MODELS" --batches "$BATCHES" --steps "$STEPS" --warmup "$WARMUP" --size "$SIZE"
        --width "$WIDTH" --precision "$PRECISION")
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
echo "GPU: ${GPU_NAME:-unknown}; models $MODELS, batches $BATCHES, $STEPS timed steps ($WARMUP warm-up), $PRECISION"

echo "+ $TG_GRAPHS ${COMMON[*]} --json"
if ! timeout "$RUN_TIMEOUT" "$TG_GRAPHS" "${COMMON[@]}" --json > "$OUT_DIR/tapegrad.log" 2>&1; then
  echo "error: tg_graphs failed (a graphed step that differs from the eager one fails here); its log:" >&2
  tail -n 30 "$OUT_DIR/tapegrad.log" >&2
  exit 1
fi
grep '^{"framework"' "$OUT_DIR/tapegrad.log" >> "$RESULTS"

echo "+ $PYTHON $HERE/torch_graphs.py ${COMMON[*]}"
if timeout "$RUN_TIMEOUT" "$PYTHON" "$HERE/torch_graphs.py" "${COMMON[@]}" > "$OUT_DIR/pytorch.log" 2>&1; then
  grep '^{"framework"' "$OUT_DIR/pytorch.log" >> "$RESULTS"
else
  echo "warning: the PyTorch side failed; the table shows n/a for it. Its log:" >&2
  tail -n 30 "$OUT_DIR/pytorch.log" >&2
fi

"$PYTHON" - "$RESULTS" "${GPU_NAME:-unknown GPU}" > "$OUT_DIR/table.md" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
steps = {(r["framework"], r["model"], r["batch"], r["mode"]): r["step_ms"] for r in rows if "step_ms" in r}
overhead = [r for r in rows if r.get("profiler_overhead")]
host = {r["framework"]: r for r in rows if r.get("host")}
precision = next((r["precision"] for r in rows if "precision" in r), "?")
torch_version = next((r["torch"] for r in rows if "torch" in r), "n/a")


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None else a / b


print(f"### Training step time, ms ({sys.argv[2]}, {precision}, PyTorch {torch_version})")
print()
print("| model | batch | tapegrad eager | tapegrad graphed | PyTorch eager | PyTorch graphed "
      "| tg graphed / tg eager | tg graphed / PyTorch graphed | tg eager / PyTorch eager |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for model, batch in sorted({(m, b) for (_, m, b, _) in steps}):
    te, tgr = steps.get(("tapegrad", model, batch, "eager")), steps.get(("tapegrad", model, batch, "graphed"))
    pe, pg = steps.get(("pytorch", model, batch, "eager")), steps.get(("pytorch", model, batch, "graphed"))
    print(f"| {model} | {batch} | {fmt(te, '.3f')} | {fmt(tgr, '.3f')} | {fmt(pe, '.3f')} | {fmt(pg, '.3f')} "
          f"| {fmt(ratio(tgr, te), '.2f')} | {fmt(ratio(tgr, pg), '.2f')} | {fmt(ratio(te, pe), '.2f')} |")
print()
print("Targets (issue 28): tg graphed / tg eager <= 0.5, tg graphed / PyTorch graphed <= 1, "
      "tg eager / PyTorch eager <= 0.5 for the small models.")
print()
print("### Host cost per op, µs")
print()
print("| framework | op launch | tape / autograd record | backward entry |")
print("|---|---:|---:|---:|")
for fw in ("tapegrad", "pytorch"):
    h = host.get(fw, {})
    print(f"| {fw} | {fmt(h.get('op_launch_us'), '.2f')} | {fmt(h.get('tape_record_us'), '.2f')} "
          f"| {fmt(h.get('backward_entry_us'), '.2f')} |")
print()
print("op launch: relu on 256 floats, no tape; record: the same with a tape (requires_grad) minus the launch; "
      "backward entry: backward over a chain of 2000 relus, per entry (its kernel launch included).")
print()
print("### Profiler overhead, tapegrad eager step, ms")
print()
print("| model | batch | profiler off | on (recording) | stopped | off again | on overhead % "
      "| stopped overhead % | off vs off % | ops recorded / step |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in sorted(overhead, key=lambda r: (r["model"], r["batch"])):
    print(f"| {r['model']} | {r['batch']} | {r['off_ms']:.3f} | {r['on_ms']:.3f} | {r['stopped_ms']:.3f} "
          f"| {r['off_again_ms']:.3f} | {r['on_overhead_pct']:+.2f} | {r['stopped_overhead_pct']:+.2f} "
          f"| {r['off_spread_pct']:.2f} | {r['ops_per_step']:.0f} |")
if not overhead:
    print("| n/a | | | | | | | | | |")
print()
print("Overheads are against the mean of the two off runs; off vs off % is their difference, the noise "
      "floor. Targets (issue 28): on overhead <= 5% of a ResNet-style step; off unmeasurable "
      "(stopped overhead within the off vs off spread).")
if any(r.get("nvtx_env") for r in overhead):
    print()
    print("TG_NVTX=1 was set: every run, off included, pushed NVTX ranges.")
EOF
echo
cat "$OUT_DIR/table.md"
echo "results: $RESULTS"
