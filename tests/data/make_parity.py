#!/usr/bin/env python3
"""PyTorch reference data for tapegrad's parity tests (tests/cpu/test_parity.cpp,
tests/cuda/test_parity_cuda.cpp).

Run from the repository root, with torch and safetensors installed:

    python3 tests/data/make_parity.py --out tests/data

For each model X in A, B, C, D, CNN it writes two files into --out:

    parity_X_model.safetensors  model.state_dict() in float32, written by
                                safetensors.torch.save_file: the file tg::load must read
    parity_X_data.safetensors   "input" (F32), "grad_output" (F32: the seed gradient of the
                                output) or "target" (I64: class indices of the CNN's
                                cross-entropy), and PyTorch's results computed in float64
                                on the CPU from the same float32 numbers: "output",
                                "grad.input" and "grad.<parameter name>" (F64)

The models are small versions of the workloads with the structure (and parameter names)
of tapegrad's modules. Everything is seeded: the same torch version writes the same tensors
(safetensors orders the metadata as it likes).
About 100 KB in all.

    python3 tests/data/make_parity.py --out tests/data --check-roundtrip DIR

additionally loads the files tapegrad's test wrote into DIR (run the parity test with
TG_PARITY_ROUNDTRIP_DIR=DIR) with safetensors.torch, and checks that they hold exactly the
tensors of PyTorch's files and load into the PyTorch models with strict=True.
"""
import argparse
import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


class MeanPool(nn.Module):
    """tapegrad's nn::MeanPool: mean over every dim after (N, C). No parameters."""

    def forward(self, x):
        return x.mean(dim=tuple(range(2, x.dim())))


def uniform(shape, gen, low=-1.0, high=1.0):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low).float()


def perturb_group_norms(model, gen):
    # GroupNorm's default gamma=1, beta=0 would hide half of what it computes.
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            with torch.no_grad():
                m.weight.copy_(uniform(m.weight.shape, gen, 0.5, 1.5))
                m.bias.copy_(uniform(m.bias.shape, gen, -0.5, 0.5))


def plain(model, x, data):
    return model(x)


def workload_c(model, x, data):
    return model(x).mean(dim=(1, 2, 3, 4))


def cnn_loss(model, x, data):
    return F.cross_entropy(model(x), data["target"])


def make_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),  # 0
        nn.GroupNorm(4, 8),             # 1
        nn.ReLU(),                      # 2
        nn.Conv2d(8, 8, 3, padding=1),  # 3
        nn.GroupNorm(4, 8),             # 4
        nn.ReLU(),                      # 5
        MeanPool(),                     # 6
        nn.Linear(8, 5),                # 7
    )


# id -> (description, builder, input shape, forward, seeded output (False: scalar loss))
MODELS = {
    "A": ("Conv2d(4->6, 3x3, no bias) on 2x4x9x11 (workload A's structure)",
          lambda: nn.Conv2d(4, 6, 3, bias=False), (2, 4, 9, 11), plain, True),
    "B": ("Conv2d(5->7, 1x1, no bias) on 2x5x6x9, NCHW; the test also runs it NHWC by permuting",
          lambda: nn.Conv2d(5, 7, 1, bias=False), (2, 5, 6, 9), plain, True),
    "C": ("Sequential(Conv3d(3->6, k=3, bias), GroupNorm(3, 6)) then mean over dims 1..4, on 2x3x5x6x7",
          lambda: nn.Sequential(nn.Conv3d(3, 6, 3), nn.GroupNorm(3, 6)), (2, 3, 5, 6, 7), workload_c, True),
    "D": ("Linear(517->1, no bias) on 33x517 (workload D's matrix-vector product)",
          lambda: nn.Linear(517, 1, bias=False), (33, 517), plain, True),
    "CNN": ("Sequential(Conv2d(3->8,3x3,pad 1), GroupNorm(4,8), ReLU, Conv2d(8->8,3x3,pad 1), GroupNorm(4,8), "
            "ReLU, MeanPool, Linear(8->5)), cross-entropy over 4 targets, on 4x3x9x11",
            make_cnn, (4, 3, 9, 11), cnn_loss, False),
}


def generate(model_id, out_dir, seed):
    description, build, in_shape, forward, seeded = MODELS[model_id]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = build().float()  # PyTorch's default init, seeded
    perturb_group_norms(model, gen)

    x = uniform(in_shape, gen)
    data = {}
    if model_id == "CNN":
        data["target"] = torch.randint(0, 5, (in_shape[0],), generator=gen, dtype=torch.int64)

    # The reference: the same float32 numbers, computed in float64 on the CPU.
    model64 = copy.deepcopy(model).double()
    x64 = x.double().requires_grad_(True)
    y = forward(model64, x64, data)
    if seeded:
        grad_output = uniform(tuple(y.shape), gen)
        y.backward(grad_output.double())
    else:
        grad_output = None
        y.backward()

    tensors = {"input": x.contiguous(), "output": y.detach().contiguous(), "grad.input": x64.grad.contiguous()}
    if grad_output is not None:
        tensors["grad_output"] = grad_output.contiguous()
    if "target" in data:
        tensors["target"] = data["target"]
    for name, p in model64.named_parameters():
        tensors["grad." + name] = p.grad.detach().contiguous()

    meta = {"format": "pt", "model": description, "torch": torch.__version__, "seed": str(seed)}
    model_path = os.path.join(out_dir, f"parity_{model_id}_model.safetensors")
    data_path = os.path.join(out_dir, f"parity_{model_id}_data.safetensors")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, model_path, metadata={"format": "pt"})
    save_file(tensors, data_path, metadata=meta)
    for path in (model_path, data_path):
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def check_roundtrip(model_id, out_dir, ours_dir):
    """tapegrad's save of PyTorch's weights, read back by safetensors.torch."""
    theirs = load_file(os.path.join(out_dir, f"parity_{model_id}_model.safetensors"))
    ours_path = os.path.join(ours_dir, f"parity_{model_id}_model.safetensors")
    ours = load_file(ours_path)
    problems = []
    if sorted(ours) != sorted(theirs):
        problems.append(f"names differ: {sorted(ours)} vs {sorted(theirs)}")
    for name, t in theirs.items():
        o = ours.get(name)
        if o is not None and (o.dtype != t.dtype or o.shape != t.shape or not torch.equal(o, t)):
            problems.append(f"{name}: {o.dtype}{list(o.shape)} differs from {t.dtype}{list(t.shape)}")
    MODELS[model_id][1]().float().load_state_dict(ours, strict=True)
    for p in problems:
        print(f"{ours_path}: {p}")
    print(f"{ours_path}: {'ok' if not problems else 'MISMATCH'}")
    return not problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/data", help="output directory (default: tests/data)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--only", choices=sorted(MODELS), action="append", help="generate only these models")
    parser.add_argument("--check-roundtrip", metavar="DIR",
                        help="also check the files tapegrad's parity test saved into DIR")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # the same summation order on every machine
    ids = args.only or list(MODELS)
    for model_id in ids:
        generate(model_id, args.out, args.seed + list(MODELS).index(model_id))
    if args.check_roundtrip:
        ok = all(check_roundtrip(model_id, args.out, args.check_roundtrip) for model_id in ids)
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
