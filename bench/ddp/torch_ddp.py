#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline for examples/ddp_train.cpp.

The same models as ddp_train's --model, with the same per-rank batch, sizes, optimizer and
precision, one process per GPU, launched by torchrun:

    torchrun --standalone --nproc_per_node 4 bench/ddp/torch_ddp.py --batch 64 --size 64
    torchrun --standalone --nproc_per_node 4 bench/ddp/torch_ddp.py --model conv_a

--model resnet (the default): the network of examples/common/resnet.h (ResNet-18-style,
GroupNorm in place of BatchNorm), cross-entropy, SGD with momentum 0.9, lr 0.02.
--model conv_a: workload A's training step (examples/workload_a.cpp): Conv2d(64 -> 128, 3x3,
stride 1, pad 0, no bias) on x (--batch, 64, --size, 2 --size), default 8x64x512x1024 per
GPU, MSE against a fixed random target of the output's shape, plain SGD at lr 16.

Each rank trains on one fixed random batch of its own (ddp_train --data fixed does the same
for the ResNet; its conv_a always does), so that the timings are those of the training step
alone: forward, backward with DDP's bucketed gradient all-reduce, SGD step. The steps after
--warmup are timed with CUDA events between barriers; the slowest rank's time is taken.
Rank 0 prints one JSON line:

    {"framework":"pytorch","model":"resnet","gpus":4,"step_ms":...,"images_per_s":...,...}

images_per_s counts the global batch (gpus x --batch) per step. --cpu runs the same on CPU
processes (gloo, wall-clock timing): a smoke test of the script where no GPU is at hand.
"""
import argparse
import json
import os
import sys
import time

# NVLink SHARP (NVLS) multicast is off on these machines for every process (see
# bench/ddp/run.sh); set here too so that a direct torchrun launch behaves the same.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("resnet", "conv_a"), default="resnet")
    p.add_argument("--batch", type=int, help="images per GPU per step (resnet 64, conv_a 8)")
    p.add_argument("--size", type=int,
                   help="resnet: image height and width (64); conv_a: x is (batch, 64, size, 2 size) (512)")
    p.add_argument("--width", type=int, default=64, help="resnet: channels of layer1 (64: ResNet-18)")
    p.add_argument("--classes", type=int, default=10, help="resnet: classes")
    p.add_argument("--steps", type=int, default=50, help="training steps, warm-up included")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    p.add_argument("--lr", type=float, help="resnet 0.02, conv_a 16 (workload A's)")
    p.add_argument("--momentum", type=float, help="resnet 0.9, conv_a 0 (workload A's plain SGD)")
    p.add_argument("--precision", choices=("fp32", "tf32"), default="tf32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="gloo on CPU processes (a smoke test, not a benchmark)")
    a = p.parse_args()
    conv_a = a.model == "conv_a"
    defaults = {"batch": 8 if conv_a else 64, "size": 512 if conv_a else 64,
                "lr": 16.0 if conv_a else 0.02, "momentum": 0.0 if conv_a else 0.9}
    for name, value in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")
    if a.width < 2 or a.width % 2:
        p.error("--width must be even and at least 2")
    if conv_a and a.size < 3:
        p.error("--size must be at least 3 for conv_a (a 3x3 conv without padding)")
    return a


# The ResNet-style model is compare_zoo's mirror of examples/common/resnet.h (tapegrad's
# parameter names), with groups = min(32, width / 2) as in examples/ddp_train.cpp.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from compare_zoo import resnet_mirror  # noqa: E402  (bench/compare_zoo.py)


def main():
    a = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    conv_a = a.model == "conv_a"

    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True  # the shapes never change: pick the fastest kernels once

    torch.manual_seed(a.seed)  # DDP broadcasts rank 0's weights in any case
    if conv_a:
        model = nn.Conv2d(64, 128, 3, stride=1, padding=0, bias=False).to(device)
    else:
        model = resnet_mirror(torch, min(32, a.width // 2), a.classes, a.width).to(device)
    # bucket_cap_mb 25 as tapegrad's default.
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=None if a.cpu else [local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)

    g = torch.Generator(device=device)
    g.manual_seed(1000 + a.seed * 7919 + rank)  # a different batch per rank
    if conv_a:
        x = torch.randn(a.batch, 64, a.size, 2 * a.size, device=device, generator=g)
        y = torch.randn(a.batch, 128, a.size - 2, 2 * a.size - 2, device=device, generator=g)
        loss_fn = F.mse_loss
        shape_fields = {"input": list(x.shape)}
    else:
        x = torch.randn(a.batch, 3, a.size, a.size, device=device, generator=g)
        y = torch.randint(0, a.classes, (a.batch,), device=device, generator=g)
        loss_fn = F.cross_entropy
        shape_fields = {"size": a.size, "width": a.width}

    def step():
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # as tapegrad's zero_grad: the grads are dropped
        return loss

    for _ in range(a.warmup):
        step()
    timed = a.steps - a.warmup
    if a.cpu:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(timed):
            loss = step()
        elapsed_ms = 1e3 * (time.perf_counter() - t0)
    else:
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(timed):
            loss = step()
        end.record()
        end.synchronize()
        elapsed_ms = start.elapsed_time(end)
    ms = torch.tensor([elapsed_ms], device=device, dtype=torch.float64)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank's window
    print(f"[rank {rank}] loss {loss.item():.4f}", flush=True)
    if rank == 0:
        step_ms = ms.item() / timed
        print(json.dumps({
            "framework": "pytorch",
            "model": a.model,
            "gpus": world,
            "device": "cpu" if a.cpu else torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "batch_per_rank": a.batch,
            **shape_fields,
            "precision": a.precision,
            "steps_timed": timed,
            "step_ms": round(step_ms, 3),
            "images_per_s": round(world * a.batch * 1e3 / step_ms, 1),
        }, separators=(",", ":")), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
