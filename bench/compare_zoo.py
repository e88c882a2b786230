#!/usr/bin/env python3
"""tapegrad next to PyTorch on bench/zoo's rows (ordinary layer shapes and a ResNet-18-style
model with GroupNorm), measured in one run on one GPU.

Runs tg_zoo --json (each row checked against tapegrad's f64 CPU backend before it is timed),
then times PyTorch eager on the same rows, passes and precision:
  forward   the op (or the model) without autograd
  fwd+bwd   y = op(x); y.backward(dy): the input gradient and every parameter gradient
  step      (model) forward, cross entropy against fixed labels, backward, SGD, zero_grad
with cudnn.benchmark on, TF32 on or off to match each row, NHWC rows in channels_last,
GroupNorm through F.group_norm, Linear through F.linear, and the model's PyTorch mirror
loaded with tapegrad's initial weights (tg_zoo writes them with tg::save). CUDA events,
warm-up, the median of the repeats tg_zoo used (compare_torch.py's timing). Prints a markdown
table with the ratios tapegrad/PyTorch, their geometric means per precision (layer rows;
the model separately) and the worst row; --out FILE writes it with the GPU, date and command.
A PyTorch row that fails is reported in the table, never fatal.

  python3 bench/compare_zoo.py --tg-zoo build/bench/tg_zoo
  python3 bench/compare_zoo.py --tg-zoo build/bench/tg_zoo --rows 'c2d_1x1|lin_' --precision tf32 --quick
"""
import argparse
import contextlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (timing, TF32 switch, results-file header)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--tg-zoo", default=os.path.join(here, "..", "build", "bench", "tg_zoo"), help="the tg_zoo program")
    p.add_argument("--tg-json", help="reuse this tg_zoo --json output instead of running tg_zoo")
    p.add_argument("--rows", default=".", help="regular expression on row names (tg_zoo --list shows them)")
    p.add_argument("--precision", default="fp32,tf32")
    p.add_argument("--quick", action="store_true", help="fewer repeats (5) on both sides")
    p.add_argument("--repeats", type=int, help="repeats on both sides (default 20, 5 with --quick)")
    p.add_argument("--idle-ms", type=int, default=0, help="idle GPU time before each timed repeat, both sides")
    p.add_argument("--tg-args", default="", help="more tg_zoo arguments, e.g. \"--model-batch 32 --tol-tf32 2e-3\"")
    p.add_argument("--out", help="write the tables (with GPU, date and command) to this markdown file")
    return p.parse_args()


def run_tg_zoo(args):
    return ct.run_json_program([args.tg_zoo, "--json", "--rows", args.rows, "--precision", args.precision], args)


def load_safetensors(torch, path):
    """name -> CPU tensor. The safetensors package when importable, else the format itself:
    8-byte little-endian header length, a JSON header, the raw little-endian data."""
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]).reshape(info["shape"]).clone()
    return out


def one_or_tuple(v):
    """tg_zoo lists one value per spatial dim, or one for all; PyTorch takes an int for the latter."""
    return v[0] if len(v) == 1 else tuple(v)


class TorchLayer:
    """One layer row in PyTorch, rebuilt from tg_zoo's "spec"; init as bench/zoo_rows.cpp."""

    def __init__(self, torch, kind, spec):
        F, dev = torch.nn.functional, "cuda"
        uniform = lambda shape, lo, hi: torch.rand(*shape, device=dev) * (hi - lo) + lo  # noqa: E731
        x_shape, w_shape = spec["x"], spec["w"]
        self.b = None
        if kind == "group_norm":
            self.x = torch.randn(*x_shape, device=dev)
            self.w, self.b = uniform(w_shape, 0.5, 1.5), uniform(w_shape, -0.5, 0.5)
            groups, eps = spec["groups"], spec.get("eps", 1e-5)
            self.op = lambda x, w, b: F.group_norm(x, groups, w, b, eps)
        else:
            bound = 1 / math.sqrt(math.prod(w_shape[1:]))
            self.w = uniform(w_shape, -bound, bound)
            if spec["bias"]:
                self.b = uniform([w_shape[0]], -bound, bound)
            if kind == "linear":
                self.x = torch.randn(*x_shape, device=dev)
                self.op = F.linear
            elif kind in ("conv2d", "conv3d"):
                if spec.get("layout") == "nhwc":
                    # channels_last: logical NCHW over NHWC memory, what tapegrad's Layout::NHWC holds
                    self.x = torch.randn(*x_shape, device=dev).permute(0, 3, 1, 2)
                    self.w = self.w.contiguous(memory_format=torch.channels_last)
                else:
                    self.x = torch.randn(*x_shape, device=dev)
                conv = F.conv2d if kind == "conv2d" else F.conv3d
                st, pad, dil = (one_or_tuple(spec[k]) for k in ("stride", "padding", "dilation"))
                self.op = lambda x, w, b: conv(x, w, b, st, pad, dil)
            else:
                raise ValueError(f"unknown kind {kind}")
        self.params = [t for t in (self.w, self.b) if t is not None]
        for t in self.params:
            t.requires_grad_(True)
        with torch.no_grad():
            self.dy = torch.randn_like(self.forward())  # in y's memory format (channels_last for NHWC)

    def forward(self):
        return self.op(self.x, self.w, self.b)


def time_layer(torch, w, pass_name, warmup, repeats, bf16=False):
    """bf16: the forward under torch.autocast(bfloat16), the backward outside it (as tg_zoo's
    bf16 rows under tg::Autocast), with dy in y's dtype."""
    def forward():
        if not bf16:
            return w.forward()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return w.forward()

    if pass_name == "forward":
        def run(start, end):
            with torch.no_grad():
                start.record()
                forward()
                end.record()
        return ct.time_events(torch, warmup, repeats, run)
    w.x.requires_grad_(True)
    seeds = {}

    def run(start, end):
        for t in w.params + [w.x]:
            t.grad = None  # fresh gradients each time, as tg_zoo
        start.record()
        y = forward()
        if y.dtype not in seeds:
            seeds[y.dtype] = w.dy.to(y.dtype)
        y.backward(seeds[y.dtype])
        end.record()
    return ct.time_events(torch, warmup, repeats, run)


def resnet_mirror(torch, groups, classes, width=64):
    """bench/zoo_model.h's network with its parameter names (conv1, gn1, layerN.M.*, fc); `width`
    channels in the first stage, doubling per stage (bench/graphs uses narrower ones)."""
    nn, F = torch.nn, torch.nn.functional

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.gn1 = nn.GroupNorm(groups, cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.gn2 = nn.GroupNorm(groups, cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))

        def forward(self, x):
            y = self.gn2(self.conv2(F.relu(self.gn1(self.conv1(x)))))
            return F.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet18GN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
            self.gn1 = nn.GroupNorm(groups, width)
            cin = width
            for i, w in enumerate((width, 2 * width, 4 * width, 8 * width)):
                stride = 1 if i == 0 else 2
                blocks = nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1))
                setattr(self, f"layer{i + 1}", blocks)
                cin = w
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            h = F.relu(self.gn1(self.conv1(x)))
            for i in range(1, 5):
                h = getattr(self, f"layer{i}")(h)
            return self.fc(h.mean(dim=(2, 3)))

    return ResNet18GN()


class TorchModel:
    """The model row: the mirror with tapegrad's initial weights, and tapegrad's x and labels."""

    def __init__(self, torch, spec, files):
        self.torch, self.weights = torch, load_safetensors(torch, files["weights"])
        self.model = resnet_mirror(torch, spec["groups"], spec["classes"]).cuda()
        self.restore()
        io = load_safetensors(torch, files["io"])
        self.x, self.labels, self.tg_logits = io["x"].cuda(), io["labels"].cuda(), io["logits"].cuda()
        self.lr = spec["lr"]

    def restore(self):
        self.model.load_state_dict(self.weights, strict=True)  # names must match bench/zoo_model.h's

    def logits_error(self):
        """Relative L2 difference of PyTorch's FP32 logits from tapegrad's, at the initial weights."""
        torch = self.torch
        ct.set_tf32(torch, False)
        self.restore()
        with torch.no_grad():
            y = self.model(self.x).double()
        return float((y - self.tg_logits.double()).norm() / self.tg_logits.double().norm())


def time_model(torch, m, pass_name, warmup, repeats, bf16=False):
    """bf16: PyTorch's AMP step (the forward and loss under torch.autocast(bfloat16), the backward
    outside it; no loss scaling with bf16), as tg_zoo's bf16 model row."""
    m.restore()
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    if pass_name == "forward":
        def run(start, end):
            with torch.no_grad():
                start.record()
                with autocast():
                    m.model(m.x)
                end.record()
        return ct.time_events(torch, warmup, repeats, run)
    opt = torch.optim.SGD(m.model.parameters(), lr=m.lr)

    def run(start, end):
        start.record()
        with autocast():
            loss = torch.nn.functional.cross_entropy(m.model(m.x), m.labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
    return ct.time_events(torch, warmup, repeats, run)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def tables(results):
    """The per-row table and the summary (geometric means, worst row) as markdown."""
    rows = ["| row | shape | precision | pass | check err | tapegrad ms | PyTorch ms | tapegrad/PyTorch |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    ratios = {}  # (precision, "layer" | "model", pass) -> [(ratio, name)]
    for r, ms, err in results:
        tg_ms = f'{r["ms"]:.3f}' if r.get("ok") else f'check failed: {r.get("failed", "")[:80]}'
        pt_ms = f"{ms:.3f}" if ms is not None else f"error: {err[:80]}"
        ratio = ""
        if r.get("ok") and ms:
            ratio = f'{r["ms"] / ms:.3f}'
            group = "model" if r["kind"] == "model" else "layer"
            ratios.setdefault((r["precision"], group, r["pass"]), []).append((r["ms"] / ms, r["name"]))
        check = "-" if r.get("check_err") is None else f'{r["check_err"]:.1e}'
        rows.append(f'| {r["name"]} | {r["shape"]} | {r["precision"]} | {r["pass"]} | {check} | {tg_ms} | {pt_ms} '
                    f'| {ratio} |')
    summary = ["| precision | layer rows: forward | fwd+bwd | all | worst row | model forward | model step |",
               "|---|---:|---:|---:|---|---:|---:|"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for prec in dict.fromkeys(r["precision"] for r, _, _ in results):
        fwd, bwd = ratios.get((prec, "layer", "forward"), []), ratios.get((prec, "layer", "fwd+bwd"), [])
        both = [(v, f"{name} forward") for v, name in fwd] + [(v, f"{name} fwd+bwd") for v, name in bwd]
        worst = max(both, default=None)
        model = {p: ratios.get((prec, "model", p), []) for p in ("forward", "step")}
        gm = lambda pairs: fmt(geomean([v for v, _ in pairs]))  # noqa: E731
        summary.append(f"| {prec} | {gm(fwd)} ({len(fwd)}) | {gm(bwd)} ({len(bwd)}) | {gm(both)} | "
                       f"{'-' if worst is None else f'{worst[1]}: {worst[0]:.3f}'} | "
                       f"{gm(model['forward'])} | {gm(model['step'])} |")
    return "\n".join(rows), "\n".join(summary)


def main():
    args = parse_args()
    tg = json.load(open(args.tg_json)) if args.tg_json else run_tg_zoo(args)
    repeats, warmup = tg.get("repeats", 20), tg.get("warmup", 3)
    ct.IDLE_MS = tg.get("idle_ms", 0)

    import torch  # after tg_zoo exits, so the two never share the GPU's memory
    torch.backends.cudnn.benchmark = True

    groups = {}  # each PyTorch row is built once for all its (precision, pass) rows
    for r in tg["rows"]:
        groups.setdefault(r["name"], []).append(r)
    results, notes = [], []
    for name, rows in groups.items():
        print(f"PyTorch: {name}", file=sys.stderr, flush=True)
        w, build_error = None, None
        try:
            if rows[0]["kind"] == "model":
                w = TorchModel(torch, rows[0]["spec"], tg["model_files"])
                try:
                    notes.append(f"- {name}: PyTorch's FP32 logits at the initial weights differ from tapegrad's "
                                 f"by {w.logits_error():.2e} (relative L2; same network, weights and input)")
                except Exception as e:  # noqa: BLE001  (the timing can still run)
                    notes.append(f"- {name}: comparing the logits failed: {type(e).__name__}: {e}")
            else:
                w = TorchLayer(torch, rows[0]["kind"], rows[0]["spec"])
        except Exception as e:  # noqa: BLE001  (reported in the table)
            build_error = f"{type(e).__name__}: {e}"
        for r in rows:
            ms, err = None, build_error
            if w is not None:
                try:
                    ct.set_tf32(torch, r["precision"] == "tf32")
                    # cudnn.benchmark picks algorithms during the warm-up: give it a little more.
                    if r["kind"] == "model":
                        ms = time_model(torch, w, r["pass"], warmup + 2, repeats, bf16=r["precision"] == "bf16")
                    else:
                        ms = time_layer(torch, w, r["pass"], warmup + 2, repeats, bf16=r["precision"] == "bf16")
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {e}"
            results.append((r, ms, err))
            tg_ms = f'{r["ms"]:.3f}' if r.get("ok") else "check failed"
            pt_ms = f"{ms:.3f}" if ms is not None else f"error ({err})"
            print(f'  {r["precision"]} {r["pass"]:8s}: PyTorch {pt_ms} ms, tapegrad {tg_ms}', file=sys.stderr,
                  flush=True)
        del w
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    table, summary = tables(results)
    print(summary + "\n\n" + table)
    for n in notes:
        print(n)
    if args.out:
        tol = tg.get("tolerances", {})
        with open(args.out, "w") as f:
            f.write("# tapegrad vs PyTorch: bench/zoo (ordinary layer shapes, one model)\n\n")
            f.write(ct.gpu_line(torch))
            f.write(f"- command (on the GPU machine, from a Release build): `{ct.command_line()}` "
                    f"(`scripts/gpu-check --zoo` runs the same)\n")
            f.write(f"- PyTorch {torch.__version__} eager, `cudnn.benchmark` on, TF32 flags set per row; median of "
                    f"{repeats} repeats after warm-up, CUDA events, both sides in one run on one GPU. Every tapegrad "
                    f"row was checked against tapegrad's f64 CPU backend on a slice of the batch before it was timed "
                    f"(relative L2 limits: layers fp32 {tol.get('fp32')}, tf32 {tol.get('tf32')}, bf16 "
                    f"{tol.get('bf16')}; model fp32 "
                    f"{tol.get('model_fp32')}, tf32 {tol.get('model_tf32')}, bf16 {tol.get('model_bf16')}).\n")
            f.write("- passes: `forward` (no autograd), `fwd+bwd` (forward and backward with the input and parameter "
                    "gradients), `step` (model: forward, cross entropy, backward, SGD, zero_grad). FP32 means "
                    "FP32-accurate results (PyTorch: TF32 off); bf16 means mixed precision: the forward (and the "
                    "model's loss) under tg::Autocast(bf16) / torch.autocast(bfloat16) on f32 inputs and "
                    "parameters, the backward outside it.\n")
            for n in notes:
                f.write(n + "\n")
            f.write("\n## Geometric means of tapegrad/PyTorch (rows counted in parentheses)\n\n" + summary + "\n\n")
            f.write("## Every row\n\n" + table + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    failed = any(not r.get("ok") or ms is None for r, ms, _ in results)
    sys.exit(2 if failed else 0)


if __name__ == "__main__":
    main()
