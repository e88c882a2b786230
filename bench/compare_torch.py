#!/usr/bin/env python3
"""tapegrad next to PyTorch on workloads A-D, measured in one run on one GPU.

Runs tg_bench --json (which checks every row against f64 references before timing it),
then times PyTorch eager on the same shapes, passes and precision:
  forward      y = model(x) without autograd
  backward     y.backward(dy) for a y recorded just before: parameter gradients, and the
               input's where the tg_bench row had it (its "x_grad": A, B, D yes, C no)
  backward_dx  (C) the same with the input gradient
  step         forward + MSE against a fixed target + backward + SGD step + zero_grad
with torch.backends.cudnn.benchmark = True, TF32 switched on or off to match each row
(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32; bf16 rows run
under torch.autocast("cuda", torch.bfloat16) with TF32 on, as tg_bench's tg::Autocast rows,
their upstream gradient made bf16 beforehand on both sides), CUDA events,
warm-up, and the median of the same number of repeats tg_bench used (>= 20 unless --quick).
Prints one markdown table; --out FILE writes it with the GPU name, the date and the command.
Workload C is the fused layer in tapegrad (nn::Conv3dGroupNormMean, one op); its peer here is
PyTorch's eager composition Conv3d -> GroupNorm -> mean (three ops). The issue's targets for
C (fused forward <= 0.2x PyTorch, training step <= 0.25x) are marked in the last column.

  python3 bench/compare_torch.py --tg-bench build/bench/tg_bench
  python3 bench/compare_torch.py --tg-bench build/bench/tg_bench --workloads A,D --quick --out bench/RESULTS.md
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--tg-bench", default=os.path.join(here, "..", "build", "bench", "tg_bench"),
                   help="path of the tg_bench program")
    p.add_argument("--tg-json", help="reuse this tg_bench --json output instead of running tg_bench")
    p.add_argument("--workloads", default="A,B,C,D")
    p.add_argument("--layout", default="both", choices=["nchw", "nhwc", "both"], help="for B")
    p.add_argument("--precision", default="fp32,tf32", help="any of fp32, tf32, bf16 (A and B only)")
    p.add_argument("--passes", default="forward,backward,backward_dx,step",
                   help="backward_dx makes rows only for C (A, B, D's backward already has dx)")
    p.add_argument("--quick", action="store_true", help="fewer repeats (5) on both sides")
    p.add_argument("--repeats", type=int, help="repeats on both sides (default 20, 5 with --quick)")
    p.add_argument("--idle-ms", type=int, default=0,
                   help="idle GPU time before each timed repeat, on both sides (bench/gpu_timer.h says why)")
    p.add_argument("--out", help="write the table (with GPU, date and command) to this markdown file")
    return p.parse_args()


def run_json_program(cmd, args):
    """Runs a tapegrad benchmark with the repeat options of args and returns its JSON object.
    The program prints its progress on stderr (passed through) and the JSON on stdout; exit
    code 2 means some row failed its check: those rows are reported, not timed."""
    cmd = list(cmd)
    if args.quick:
        cmd.append("--quick")
    if args.repeats:
        cmd += ["--repeats", str(args.repeats)]
    if args.idle_ms:
        cmd += ["--idle-ms", str(args.idle_ms)]
    cmd += shlex.split(getattr(args, "tg_args", "") or "")
    print("running:", " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode not in (0, 2):
        sys.exit(f"{os.path.basename(cmd[0])} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout)


def run_tg_bench(args):
    return run_json_program([args.tg_bench, "--json", "--workloads", args.workloads, "--layout", args.layout,
                             "--precision", args.precision, "--passes", args.passes], args)


def own_table(tg):
    """tapegrad's own numbers from the same tg_bench run, against the measured ceilings."""
    c = tg["ceilings"]
    lines = ["| workload | layout | pass | precision | check err | ms | TFLOP/s | % of peak | GB/s | % of copy | target |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in tg["rows"]:
        if not r.get("ok"):
            lines.append(f'| {r["workload"]} | {r["layout"]} | {r["pass"]} | {r["precision"]} | check failed: '
                         f'{r.get("failed", "")} | | | | | | |')
            continue
        peak = c["fp32_tflops"] if r["precision"] == "fp32" else c["tf32_tflops"]
        copy = r["gbps"] / c["copy_gbps"]
        target = COPY_TARGETS.get((r["workload"], r["pass"]))
        verdict = "" if target is None else f'>= {100 * target:.0f}% of copy: {"met" if copy >= target else "missed"}'
        lines.append(f'| {r["workload"]} | {r["layout"]} | {r["pass"]} | {r["precision"]} | {r["check_rel_error"]:.2e} '
                     f'| {r["ms"]:.3f} | {r["tflops"]:.1f} | {100 * r["tflops"] / peak:.0f}% | {r["gbps"]:.0f} '
                     f'| {100 * copy:.0f}% | {verdict} |')
    return "\n".join(lines)


def command_line():
    """This script's command line, as typed (for the results file)."""
    return " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])


def gpu_line(torch):
    """'- GPU: <name> (<MiB>), CUDA <version>, one run on <date> UTC': the first line of a results file."""
    props = torch.cuda.get_device_properties(0)
    return (f"- GPU: {props.name} ({props.total_memory // 2**20} MiB), CUDA {torch.version.cuda}, one run on "
            f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} UTC\n")


def write_results(path, tg, torch, table, probe, repeats):
    c = tg["ceilings"]
    command = command_line()
    with open(path, "w") as f:
        f.write("# tapegrad vs PyTorch: latest results\n\n")
        f.write(gpu_line(torch))
        f.write(f"- command (on the GPU machine, from a Release build): `{command}` (`scripts/gpu-check --bench` runs "
                f"the same)\n")
        f.write(f"- PyTorch {torch.__version__} eager, `cudnn.benchmark` on, TF32 flags set per row; median of "
                f"{repeats} repeats after warm-up"
                f"{f', the GPU idle {IDLE_MS} ms before each repeat' if IDLE_MS else ', back to back'}, CUDA events; "
                f"both sides in one run on one GPU. Every tapegrad row "
                f"was checked against an f64 reference (sampled outputs and gradients) before it was timed.\n")
        f.write(f"- ceilings measured by tg_bench in the same run: copy {c['copy_gbps']:.0f} GB/s (device-to-device, "
                f"read + write), FP32 GEMM {c['fp32_tflops']:.1f} TFLOP/s, TF32 GEMM {c['tf32_tflops']:.1f} TFLOP/s "
                f"(cuBLAS 8192^3)\n")
        f.write("- passes: `forward` (no autograd), `backward` (input and parameter gradients; for C the parameters "
                "only, `backward_dx` adds x), `step` (forward + MSE + backward + SGD), `fwd+bwd` (derived: forward + "
                "backward on each side). FP32 means FP32-accurate results (tapegrad: split-TF32 on tensor cores or "
                "FFMA; PyTorch: TF32 off); bf16 means autocast (tg::Autocast / torch.autocast, bfloat16) with TF32 on. "
                "The last column marks the issues' targets.\n\n")
        f.write(table + "\n\n## tapegrad's own numbers (same run)\n\n")
        f.write(own_table(tg) + "\n\nTFLOP/s and GB/s count the work and the bytes each pass must do; % of peak is "
                "against the FP32 or TF32 ceiling (split-TF32 FP32 rows can exceed the FFMA ceiling because they "
                "run on tensor cores; bf16 rows are set against the TF32 one); % of copy against the copy bandwidth (a read-only pass can exceed it).\n")
        if probe:
            f.write("\n## The memory system's ceiling for workload B's traffic (tg_stream_probe, same run)\n\n")
            f.write("```\n" + probe + "```\n")
    print(f"wrote {path}", file=sys.stderr)


def run_stream_probe(args):
    """tg_stream_probe's table (B's bytes moved with no arithmetic), when it was built beside tg_bench."""
    probe = os.path.join(os.path.dirname(args.tg_bench), "tg_stream_probe")
    if not os.path.exists(probe):
        return ""
    proc = subprocess.run([probe], stdout=subprocess.PIPE, text=True)
    print(proc.stdout, file=sys.stderr)
    return proc.stdout if proc.returncode == 0 else ""


# ---- the same workloads in PyTorch -----------------------------------------------------------

class TorchWorkload:
    """model, x, target and dy on the GPU, shaped like bench/workloads.h."""

    def __init__(self, torch, wid, layout):
        nn = torch.nn
        dev = "cuda"
        self.x_requires_grad = False
        if wid == "A":
            self.model = nn.Conv2d(64, 128, 3, bias=False).to(dev)
            self.x = torch.randn(8, 64, 512, 1024, device=dev)
            self.forward = self.model
        elif wid == "B":
            self.model = nn.Conv2d(64, 128, 1, bias=False).to(dev)
            if layout == "nhwc":
                # channels_last: logical NCHW with NHWC memory, what tapegrad's Layout::NHWC holds
                self.model = self.model.to(memory_format=torch.channels_last)
                self.x = torch.randn(16, 1024, 1024, 64, device=dev).permute(0, 3, 1, 2)
            else:
                self.x = torch.randn(16, 64, 1024, 1024, device=dev)
            self.forward = self.model
        elif wid == "C":
            conv = nn.Conv3d(3, 24, 3).to(dev)
            norm = nn.GroupNorm(8, 24).to(dev)
            with torch.no_grad():  # perturbed as in tg_bench (values do not change the timing)
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
            self.model = nn.Sequential(conv, norm)
            self.x = torch.randn(128, 3, 24, 32, 32, device=dev)
            self.forward = lambda x: self.model(x).mean(dim=(1, 2, 3, 4))
        elif wid == "D":
            self.model = nn.Linear(1048576, 1, bias=False).to(dev)
            self.x = torch.randn(2048, 1048576, device=dev)
            self.forward = self.model
        else:
            raise ValueError(f"unknown workload {wid}")
        with torch.no_grad():
            y = self.forward(self.x)
        # target and dy in the output's memory format (channels-last for B nhwc)
        self.target = torch.randn_like(y)
        self.dy = torch.randn_like(y)
        del y


IDLE_MS = 0  # --idle-ms: set in main, the same as tg_bench's


def time_events(torch, warmup, repeats, run):
    """run(start, end) records the two events around what it times; returns the median ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + repeats):
        if i >= warmup and IDLE_MS:
            time.sleep(IDLE_MS / 1000)  # the previous repeat has synchronized
        run(start, end)
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_torch(torch, w, pass_name, x_grad, warmup, repeats, autocast=False):
    params = list(w.model.parameters())

    def scope():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast)

    def zero_grads():
        for p in params:
            p.grad = None
        w.x.grad = None

    if pass_name == "forward":
        def run(start, end):
            with torch.no_grad(), scope():
                start.record()
                w.forward(w.x)
                end.record()
        return time_events(torch, warmup, repeats, run)

    if pass_name in ("backward", "backward_dx"):
        w.x.requires_grad_(x_grad)
        dy = w.dy.to(torch.bfloat16) if autocast else w.dy

        def run(start, end):
            zero_grads()
            with scope():
                y = w.forward(w.x)  # recorded, not timed
            start.record()
            y.backward(dy)
            end.record()
        ms = time_events(torch, warmup, repeats, run)
        zero_grads()
        w.x.requires_grad_(False)
        return ms

    opt = torch.optim.SGD(params, lr=1e-7)  # tiny steps, as tg_bench

    def run(start, end):
        start.record()
        with scope():
            loss = torch.nn.functional.mse_loss(w.forward(w.x), w.target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
    return time_events(torch, warmup, repeats, run)


# The targets, as tapegrad / PyTorch time ratios: workload C's fused layer.
# The issues' targets, as ratios tapegrad / PyTorch: (workload, layout or None, pass,
# precision or None). "fwd+bwd" rows are derived: forward + backward on each side.
TARGETS = {
    ("A", None, "forward", "tf32"): 0.55, ("A", None, "fwd+bwd", "tf32"): 0.45,
    ("A", None, "forward", "fp32"): 0.50, ("A", None, "fwd+bwd", "fp32"): 0.50,
    ("B", "nchw", "fwd+bwd", "tf32"): 0.50, ("B", "nhwc", "fwd+bwd", "tf32"): 0.90,
    ("B", "nchw", "fwd+bwd", "fp32"): 0.35,
    ("C", None, "forward", None): 0.20, ("C", None, "step", None): 0.25,
    ("D", None, "fwd+bwd", None): 0.85,
    ("A", None, "forward", "bf16"): 0.55, ("A", None, "fwd+bwd", "bf16"): 0.50,
}
# Targets as fractions of the measured copy bandwidth (tapegrad's own table).
COPY_TARGETS = {("B", "forward"): 0.90, ("D", "forward"): 0.95, ("D", "backward"): 0.90}


def target_of(r):
    for key in ((r["workload"], r["layout"], r["pass"], r["precision"]), (r["workload"], None, r["pass"], r["precision"]),
                (r["workload"], None, r["pass"], None)):
        if key in TARGETS:
            return TARGETS[key]
    return None


def with_fwd_bwd_rows(results):
    """Adds a derived "fwd+bwd" row after each (workload, layout, precision)'s backward row."""
    out, seen = [], {}
    for r, ms in results:
        out.append((r, ms))
        key = (r["workload"], r["layout"], r["precision"])
        seen.setdefault(key, {})[r["pass"]] = (r, ms)
        both = seen[key]
        if r["pass"] == "backward" and "forward" in both:
            (f, f_ms), (b, b_ms) = both["forward"], both["backward"]
            ok = f.get("ok") and b.get("ok")
            out.append((dict(f, **{"pass": "fwd+bwd", "ms": f["ms"] + b["ms"], "ok": ok}), f_ms + b_ms))
    return out


def set_tf32(torch, on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def main():
    args = parse_args()
    tg = json.load(open(args.tg_json)) if args.tg_json else run_tg_bench(args)
    repeats, warmup = tg.get("repeats", 20), tg.get("warmup", 3)
    global IDLE_MS
    IDLE_MS = tg.get("idle_ms", 0)

    import torch  # after tg_bench exits, so the two never share the GPU's memory
    torch.backends.cudnn.benchmark = True

    # Group rows by (workload, layout) so each PyTorch workload is built once.
    groups = {}
    for r in tg["rows"]:
        groups.setdefault((r["workload"], r["layout"]), []).append(r)
    results = []
    for (wid, layout), rows in groups.items():
        print(f"PyTorch: workload {wid} ({layout})", file=sys.stderr, flush=True)
        w = TorchWorkload(torch, wid, layout)
        for r in rows:
            set_tf32(torch, r["precision"] in ("tf32", "bf16"))
            # cudnn.benchmark picks algorithms during the warm-up: give it a little more.
            # Older tg_bench JSON has no x_grad: its backward rows all had the input gradient.
            x_grad = r.get("x_grad", r["pass"] in ("backward", "backward_dx"))
            ms = time_torch(torch, w, r["pass"], x_grad, warmup + 2, repeats, autocast=r["precision"] == "bf16")
            results.append((r, ms))
            tg_ms = f'{r["ms"]:.3f}' if r.get("ok") else "check failed"
            print(f'  {r["pass"]:11s} {r["precision"]}: PyTorch {ms:.3f} ms, tapegrad {tg_ms}', file=sys.stderr,
                  flush=True)
        del w
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    lines = ["| workload | pass | precision | PyTorch ms | tapegrad ms | ratio (tapegrad/PyTorch) | target |",
             "|---|---|---|---:|---:|---:|---|"]
    for r, ms in with_fwd_bwd_rows(results):
        name = r["workload"] + (f' ({r["layout"]})' if r["workload"] == "B" else "")
        target = target_of(r)
        if r.get("ok"):
            ratio = r["ms"] / ms
            verdict = "" if target is None else f'<= {target:.2f}: {"met" if ratio <= target else "missed"}'
            lines.append(f'| {name} | {r["pass"]} | {r["precision"]} | {ms:.3f} | {r["ms"]:.3f} | {ratio:.3f} '
                         f'| {verdict} |')
        else:
            verdict = "" if target is None else f"<= {target:.2f}"
            lines.append(f'| {name} | {r["pass"]} | {r["precision"]} | {ms:.3f} | check failed | - | {verdict} |')
    table = "\n".join(lines)
    print(table)
    probe = run_stream_probe(args)

    if args.out:
        write_results(args.out, tg, torch, table, probe, repeats)


if __name__ == "__main__":
    main()
