"""Plain PyTorch baselines of the FashionMNIST ResNet-18 step, one process, no DDP.

The recipe of ddp_torchrun.py (the same model, Adam lr 1e-3, cross-entropy,
data normalised once) in the three forms a Python user without a launcher
writes on one GPU:
  loader    a DataLoader over a TensorDataset, pinned batches, non_blocking copies
  resident  the whole dataset on the device, each batch gathered there by index
  graph     resident, and forward, backward and Adam's step (capturable) captured
            once as a CUDA graph and replayed (CUDA only)
Each step ends with loss.item(), as a training loop that logs does. Prints one
JSON line: {"samples_per_s": ..., "peak_rss_mb": ...}.

  python plain_step.py --mode resident --batch 128 --warmup 30 --steps 300 [--device cuda]
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_torchrun import DATA, read_idx, resnet18  # noqa: E402


def adam(model, cuda, **options):
    """Adam lr 1e-3; on CUDA its fused kernel, the one train::optim::Adam takes there."""
    return torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if cuda else {}),
                            **options)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["loader", "resident", "graph"], default="resident")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    args = parser.parse_args()
    if args.mode == "graph" and args.device != "cuda":
        sys.exit("plain_step.py: --mode graph needs --device cuda")
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz")
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz").long()
    data = ((images.float() / 255.0 - 0.28604) / 0.32025).unsqueeze(1)
    torch.manual_seed(0)
    model = resnet18()
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model = model.to(device)
    criterion = nn.CrossEntropyLoss()
    total = args.warmup + args.steps
    if total * args.batch > data.size(0):
        sys.exit(f"plain_step.py: {total} steps of {args.batch} need more than one epoch")

    if args.mode == "loader":
        optimizer = adam(model, cuda)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, labels),
                                             batch_size=args.batch, shuffle=True,
                                             pin_memory=cuda, drop_last=True)
        batches = ((x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                   for x, y in loader)
    else:
        data, labels = data.to(device), labels.to(device)
        order = torch.randperm(data.size(0), device=device)

        def gather():
            for i in range(total):
                index = order[i * args.batch:(i + 1) * args.batch]
                yield data[index], labels[index]
        batches = gather()

    if args.mode == "graph":
        optimizer = adam(model, cuda, capturable=True)
        static_x = torch.empty((args.batch, 1, 28, 28), device=device)
        static_y = torch.empty((args.batch,), dtype=torch.long, device=device)
        # PyTorch's recipe: a few eager steps on a side stream, then one capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                x, y = next(batches)
                static_x.copy_(x)
                static_y.copy_(y)
                optimizer.zero_grad(set_to_none=True)
                criterion(model(static_x), static_y).backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = criterion(model(static_x), static_y)
            static_loss.backward()
            optimizer.step()

        def step(x, y):
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            return static_loss.item()
        total -= 3
    else:
        if args.mode == "resident":
            optimizer = adam(model, cuda)

        def step(x, y):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.item()

    samples, start = 0, None
    for i, (x, y) in enumerate(batches):
        if i == total:
            break
        if i == total - args.steps:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        step(x, y)
        if start is not None:
            samples += x.size(0)
    elapsed = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"samples_per_s": samples / elapsed, "peak_rss_mb": rss}))


if __name__ == "__main__":
    main()
