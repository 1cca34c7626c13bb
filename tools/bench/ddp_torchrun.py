"""The torchrun + DistributedDataParallel side of the throughput benchmark.

The same recipe as plugins/fashion_mnist: torchvision's ResNet-18 with a 1-channel
7x7 stride-2 conv1, Adam lr 1e-3, cross-entropy, batch 128 per worker, FashionMNIST
normalised with (0.28604, 0.32025), DistributedSampler. Prints one JSON line with
the steady-state samples/s (all ranks) and the peak RSS of each rank.
Run with: torchrun --nproc_per_node N ddp_torchrun.py --warmup 5 --steps 30
Also runs without torchrun as a single process (the ceiling).
"""
import argparse
import gzip
import json
import os
import resource
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(magic & 0xFF)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    images = torch.from_numpy(read_idx(f"{DATA}/train-images-idx3-ubyte.gz").copy())
    labels = torch.from_numpy(read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    dataset = torch.utils.data.TensorDataset(
        ((images.float() / 255.0 - 0.28604) / 0.32025).unsqueeze(1), labels)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler)

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    sampler.set_epoch(0)
    samples, start = 0, None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            start = time.perf_counter()
        if step == args.warmup + args.steps:
            break
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        if step >= args.warmup:
            samples += x.size(0)
    elapsed = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    totals = torch.tensor([samples / elapsed, rss], dtype=torch.float64)
    if distributed:
        peak = totals[1:].clone()
        dist.all_reduce(totals[:1])
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        totals[1] = peak[0]
    if rank == 0:
        print(json.dumps({"samples_per_s": totals[0].item(), "peak_rss_mb": totals[1].item()}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
