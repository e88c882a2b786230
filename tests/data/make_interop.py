#!/usr/bin/env python3
"""PyTorch-written files for tapegrad's checkpoint interop tests
(tests/cpu/test_checkpoint_interop.cpp).

Run from the repository root, with torch and safetensors installed:

    python3 tests/data/make_interop.py --out tests/data

It writes, with safetensors.torch.save_file (a few KB in all):

    interop_dtypes.safetensors   known bit patterns: "f16" (F16) and "bf16" (BF16), 12 values
                                 each (+-0, subnormals, the smallest normal, 1, -2, the
                                 largest finite, +-inf, NaNs), torch's own conversion of
                                 each to float32 ("f16.as_f32", "bf16.as_f32"), and "f32"
                                 (F32) and "f64" (F64) values
    interop_mlp_{f32,f16,bf16}.safetensors
                                 the state_dict of Sequential(Linear(4, 3), ReLU,
                                 Linear(3, 2)) ("0.weight", "0.bias", "2.weight", "2.bias")
                                 in each dtype; the values are multiples of 1/64 in [-1, 1],
                                 exact in all three, so all three files hold the same numbers
    interop_net_bf16.safetensors the state_dict of Net below in bfloat16: a buffer "scale",
                                 "backbone.*" (the MLP's structure) and "head.*"

    python3 tests/data/make_interop.py --check-roundtrip DIR

loads the files tapegrad's tests wrote into DIR (run test_checkpoint_interop and test_half_ops
with TG_INTEROP_ROUNDTRIP_DIR=DIR) with safetensors.torch.load_file and checks that PyTorch's
strict load_state_dict accepts the model-only ones and refuses the checkpoint that holds
optimizer state (its "optim.*" keys); and that tapegrad's f32 -> bf16 / f16 roundings and its
bf16 / f16 elementwise ops and reductions (tg_half.safetensors) match PyTorch's on the CPU:
bit for bit for roundings and add / sub / mul / div, within one unit in the last place for
exp, tanh, sum and mean (whose f32 results may differ in the last bits); and tapegrad's linear
and conv2d under a bf16 Autocast scope against torch.autocast("cpu"), within one unit in the
last place.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

# IEEE binary16 bit patterns, with the float32 value each stands for.
F16_BITS = [
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal, 2^-24
    0x03FF,  # largest subnormal
    0x8200,  # -2^-15, a negative subnormal
    0x0400,  # smallest normal, 2^-14
    0x3C00,  # 1
    0xC000,  # -2
    0x7BFF,  # 65504, the largest finite
    0x7C00,  # +inf
    0xFC00,  # -inf
    0x7E00,  # quiet NaN
]
BF16_BITS = [
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal, 2^-133
    0x007F,  # largest subnormal
    0x8040,  # -2^-127, a negative subnormal
    0x0080,  # smallest normal, 2^-126
    0x3F80,  # 1
    0xC000,  # -2
    0x7F7F,  # largest finite, (2 - 2^-7) * 2^127
    0x7F80,  # +inf
    0xFF80,  # -inf
    0xFFC1,  # negative NaN with a payload
]


def from_bits(bits, dtype):
    signed = [b - 0x10000 if b >= 0x8000 else b for b in bits]
    return torch.tensor(signed, dtype=torch.int16).view(dtype)


def mlp():
    """tapegrad: Sequential{Linear(4, 3), ReLU, Linear(3, 2)}."""
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


class Net(nn.Module):
    """tapegrad: a module with buffer "scale", then modules "backbone" (the MLP) and "head"."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.5, -4.0]))
        self.backbone = mlp()
        self.head = nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.backbone(x) * self.scale)


def sixty_fourths(module, gen):
    """Every parameter a multiple of 1/64 in [-1, 1]: exact in f16, bf16 and f32."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randint(-64, 65, p.shape, generator=gen).float() / 64)
    return module


def state(module, dtype):
    return {k: v.to(dtype).contiguous() for k, v in module.state_dict().items()}


def write(out):
    gen = torch.Generator().manual_seed(24)
    f16 = from_bits(F16_BITS, torch.float16)
    bf16 = from_bits(BF16_BITS, torch.bfloat16)
    save_file(
        {
            "f16": f16,
            "bf16": bf16,
            "f16.as_f32": f16.float(),
            "bf16.as_f32": bf16.float(),
            "f32": torch.tensor([0.1, -1e-45, 3.4028235e38, float("inf")], dtype=torch.float32),
            "f64": torch.tensor([0.1, -5e-324, 1e300, 1 / 3], dtype=torch.float64),
        },
        os.path.join(out, "interop_dtypes.safetensors"),
    )
    m = sixty_fourths(mlp(), gen)
    for name, dtype in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
        save_file(state(m, dtype), os.path.join(out, f"interop_mlp_{name}.safetensors"))
    net = Net()
    net.backbone.load_state_dict(m.state_dict())
    sixty_fourths(net.head, gen)
    save_file(state(net, torch.bfloat16), os.path.join(out, "interop_net_bf16.safetensors"))
    for name in sorted(os.listdir(out)):
        if name.startswith("interop_"):
            print(f"{name}: {os.path.getsize(os.path.join(out, name))} bytes")


def same_bits(a, b):
    """Bitwise equality of two same-dtype tensors, NaN patterns compared as NaN."""
    ia, ib = a.view(torch.int16), b.view(torch.int16)
    nan = torch.isnan(a.float()) & torch.isnan(b.float())
    return (ia == ib) | nan


def check_half(path):
    """tapegrad's bf16 / f16 roundings and elementwise ops against PyTorch's (CPU)."""
    t = load_file(path)
    ok = True
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        mine, ref = t["x." + name], t["x.f32"].to(dt)
        bad = int((~same_bits(mine, ref)).sum())
        ok &= bad == 0
        print(f"{'ok' if bad == 0 else 'FAIL'}: f32 -> {name} rounding of {ref.numel()} values: {bad} differ from torch")
        a, b = t["a." + name], t["b." + name]
        exact = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}
        close = {"exp": torch.exp(a), "tanh": torch.tanh(a), "sum": a.sum(1), "mean": a.mean(0)}
        for op, want in exact.items():
            got = t[f"{op}.{name}"]
            bad = int((~same_bits(got, want)).sum())
            ok &= bad == 0 and got.dtype == dt
            print(f"{'ok' if bad == 0 else 'FAIL'}: {name} {op}: {bad} of {want.numel()} differ from torch (bit for bit)")
        for op, want in close.items():
            # Both round an f32 result once; the f32 results (transcendental approximations,
            # summation order) may differ in the last f32 bits, so a value near a rounding
            # midpoint may land one half-ulp apart.
            got = t[f"{op}.{name}"]
            diff = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
            bad_bits, far = int((diff != 0).sum()), int((diff > 1).sum())
            ok &= far == 0 and got.dtype == dt
            print(f"{'ok' if far == 0 else 'FAIL'}: {name} {op}: {bad_bits} of {want.numel()} differ from torch "
                  f"by one unit in the last place, {far} by more")
    # tg::Autocast against torch.autocast("cpu", bfloat16): bf16 products accumulated in f32,
    # rounded once; the summation orders differ, so a result near a rounding midpoint may land
    # one unit in the last place apart.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = {"linear": torch.nn.functional.linear(t["autocast.linear.x"], t["autocast.linear.w"],
                                                     t["autocast.linear.b"]),
                "conv": torch.nn.functional.conv2d(t["autocast.conv.x"], t["autocast.conv.w"], t["autocast.conv.b"],
                                                   padding=1)}
    for op, w in want.items():
        got = t[f"autocast.{op}.y"]
        diff = (got.view(torch.int16).int() - w.view(torch.int16).int()).abs()
        bad_bits, far = int((diff != 0).sum()), int((diff > 1).sum())
        ok &= far == 0 and got.dtype == w.dtype == torch.bfloat16
        print(f"{'ok' if far == 0 else 'FAIL'}: autocast bf16 {op}: {bad_bits} of {w.numel()} differ from "
              f"torch.autocast by one unit in the last place, {far} by more")
    return ok


def check_roundtrip(d):
    ok = True
    half = os.path.join(d, "tg_half.safetensors")
    if os.path.exists(half):
        ok &= check_half(half)
    for name, make, should_load in (
        ("tg_mlp_model_only.safetensors", mlp, True),
        ("tg_net.safetensors", Net, True),
        ("tg_mlp_with_optimizer.safetensors", mlp, False),
    ):
        sd = load_file(os.path.join(d, name))
        try:
            make().load_state_dict(sd, strict=True)
            loaded = True
            err = ""
        except RuntimeError as e:
            loaded = False
            err = str(e).splitlines()[0]
        status = "ok" if loaded == should_load else "FAIL"
        ok &= loaded == should_load
        print(f"{status}: {name}: strict load_state_dict {'accepts' if loaded else 'refuses'} it {err}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for the generated files (tests/data)")
    ap.add_argument("--check-roundtrip", metavar="DIR", help="check the files tapegrad wrote into DIR")
    args = ap.parse_args()
    if not args.out and not args.check_roundtrip:
        ap.error("give --out and/or --check-roundtrip")
    if args.out:
        write(args.out)
    if args.check_roundtrip and not check_roundtrip(args.check_roundtrip):
        sys.exit(1)


if __name__ == "__main__":
    main()
