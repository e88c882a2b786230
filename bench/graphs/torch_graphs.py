#!/usr/bin/env python3
"""PyTorch's side of bench/graphs: the same training steps as tg_graphs (graphs_bench.cpp),
eager and captured with torch.cuda.graph, timed the same way, plus PyTorch's host cost per
op launch, autograd record and backward node.

Models (mirrors of tapegrad's, same shapes; the weights are PyTorch's own init, timing only):
  cnn     the cnn example's net on 1x16x16 images
  resnet  the ResNet-18-style GroupNorm net of examples/common/resnet.h on 3xSIZExSIZE images

Each step: refill the static input and labels from a ring of 4 random batches, forward,
cross-entropy, backward, Adam (capturable=True for the graphed step, as torch.cuda.graph needs;
the eager step uses the default implementation). Before timing, the graphed step is checked
against the eager one from the same weights over 6 steps (a mismatch beyond rounding stops
the script with exit status 1).

  python3 bench/graphs/torch_graphs.py [--models cnn,resnet] [--batches 8,32] [--steps 200]
                                       [--warmup 20] [--size 32] [--width 64] [--precision fp32|tf32]

Prints one JSON object per line (bench/graphs/run.sh reads them).
"""
import argparse
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from compare_zoo import resnet_mirror  # noqa: E402  (bench/compare_zoo.py)

RING = 4
CLASSES = 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="cnn,resnet")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    return p.parse_args()


def make_cnn(nn):
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(8, 32), nn.ReLU(),
        mean_hw(nn), nn.Linear(32, CLASSES))


def mean_hw(nn):
    class MeanHW(nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3))
    return MeanHW()


def make_resnet(torch, width):
    """The zoo's ResNet-18-style GroupNorm net (compare_zoo.resnet_mirror) at `width` channels."""
    return resnet_mirror(torch, min(32, max(1, width // 2)), CLASSES, width)


class Setup:
    def __init__(self, torch, model, batch, args, seed, capturable, base=None):
        torch.manual_seed(seed)
        dev = torch.device("cuda")
        if base is not None:
            self.model = copy.deepcopy(base)
        elif model == "cnn":
            self.model = make_cnn(torch.nn).to(dev)
        else:
            self.model = make_resnet(torch, args.width).to(dev)
        shape = (batch, 1, 16, 16) if model == "cnn" else (batch, 3, args.size, args.size)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, capturable=capturable)
        self.x = torch.empty(shape, device=dev)
        self.y = torch.empty((batch,), dtype=torch.int64, device=dev)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.inputs = [torch.randn(shape, generator=gen).to(dev) for _ in range(RING)]
        self.labels = [torch.randint(0, CLASSES, (batch,), generator=gen).to(dev) for _ in range(RING)]
        self.torch = torch

    def refill(self, k):
        self.x.copy_(self.inputs[k % RING])
        self.y.copy_(self.labels[k % RING])

    def step(self):
        loss = self.torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return loss


class Graphed:
    """The step captured with torch.cuda.graph after warm-up steps on a side stream, the
    recipe of PyTorch's CUDA graphs documentation for a whole training step."""

    def __init__(self, torch, setup, warmup=3):
        self.setup, self.torch = setup, torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for k in range(warmup):
                setup.refill(k)
                setup.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = setup.step()
        self.warmup = warmup

    def __call__(self, k):
        self.setup.refill(k)
        self.graph.replay()
        return self.loss


def check(torch, model, batch, args):
    """Graphed and eager training from the same weights over the same batches agree.

    cuDNN's autotuner may pick different algorithms for the eager and the captured step, whose
    rounding differs: the check runs with deterministic algorithms and allows 1e-3 relative."""
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        check_agreement(torch, model, batch, args)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, False


def check_agreement(torch, model, batch, args):
    base = Setup(torch, model, batch, args, 7, capturable=True)
    eager = Setup(torch, model, batch, args, 7, capturable=True, base=base.model)
    graphed = Graphed(torch, base)  # trains base.warmup steps on batches 0..2 first
    for k in range(graphed.warmup):
        eager.refill(k)
        eager.step()
    for k in range(graphed.warmup, graphed.warmup + 6):
        eager.refill(k)
        le = eager.step().item()
        lg = graphed(k).item()
        if abs(le - lg) > 1e-3 * max(1.0, abs(le)):
            sys.exit(f"torch_graphs: {model} batch {batch}: step {k}: graphed loss {lg} != eager {le}")
    for pe, pg in zip(eager.model.parameters(), base.model.parameters()):
        if not torch.allclose(pe, pg, rtol=1e-3, atol=1e-5):
            sys.exit(f"torch_graphs: {model} batch {batch}: parameters differ between graphed and eager training")


def ms_per_call(torch, fn, warmup, steps):
    for k in range(warmup):
        fn(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        fn(k)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def host_us(torch, fn, n):
    for _ in range(n // 10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return us


def host_costs(torch):
    x = torch.randn(256, device="cuda")
    launch = host_us(torch, lambda: torch.relu(x), 4000)
    w = torch.randn(256, device="cuda", requires_grad=True)
    record = host_us(torch, lambda: torch.relu(w), 4000) - launch
    chain, total = 2000, 0.0
    for _ in range(5):
        h = w
        for _ in range(chain):
            h = torch.relu(h)
        loss = h.sum()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss.backward()
        total += (time.perf_counter() - t0) * 1e6 / chain
        torch.cuda.synchronize()
        w.grad = None
    return launch, record, total / 5


def main():
    args = parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    for m in models:
        for b in batches:
            check(torch, m, b, args)
    for m in models:
        for b in batches:
            s = Setup(torch, m, b, args, 11, capturable=False)
            eager_ms = ms_per_call(torch, lambda k: (s.refill(k), s.step()), args.warmup, args.steps)
            del s
            s = Setup(torch, m, b, args, 11, capturable=True)
            g = Graphed(torch, s)
            graphed_ms = ms_per_call(torch, g, args.warmup, args.steps)
            del g, s
            for mode, ms in (("eager", eager_ms), ("graphed", graphed_ms)):
                print(json.dumps({"framework": "pytorch", "model": m, "batch": b, "mode": mode,
                                  "precision": args.precision, "step_ms": round(ms, 5), "checked": True,
                                  "torch": torch.__version__}), flush=True)
    launch, record, entry = host_costs(torch)
    print(json.dumps({"framework": "pytorch", "host": True, "op_launch_us": round(launch, 3),
                      "tape_record_us": round(record, 3), "backward_entry_us": round(entry, 3)}), flush=True)


if __name__ == "__main__":
    main()
