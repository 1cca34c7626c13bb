"""The torchrun + DistributedDataParallel side of the throughput benchmarks.

The same recipe as plugins/fashion_mnist: torchvision's ResNet-18 (written out
below when torchvision is not installed: the same layers and initialisation)
with a 1-channel 7x7 stride-2 conv1, Adam lr 1e-3 (its fused kernel on CUDA),
cross-entropy, batch 128 per worker, FashionMNIST normalised with (0.28604,
0.32025), DistributedSampler.
Prints one JSON line with the steady-state samples/s (all ranks) and the peak
RSS of each rank. With --device cuda each rank uses cuda:LOCAL_RANK and NCCL,
and batches come from pinned memory with non_blocking copies, as trainrun's
prepare_data_loader does.
Run with: torchrun --nproc_per_node N ddp_torchrun.py --warmup 5 --steps 30
Also runs without torchrun as a single process (the ceiling).
"""
import argparse
import gzip
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn

DATA = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = bytearray(f.read())
    magic = int.from_bytes(data[0:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(magic & 0xFF)]
    offset = 4 + 4 * len(dims)
    return torch.frombuffer(data, dtype=torch.uint8, offset=offset).reshape(dims).clone()


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    """torchvision's resnet18(num_classes=10), for machines without torchvision."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, planes = [], 64
        for width, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers.append(nn.Sequential(BasicBlock(planes, width, stride),
                                        BasicBlock(width, width, 1)))
            planes = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18():
    try:
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    except ImportError:
        return ResNet18(num_classes=10)


def fashion_resnet18():
    """resnet18() with the 1-channel 7x7 stride-2 conv1 that FashionMNIST needs."""
    model = resnet18()
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def fashion_mnist(split):
    """FashionMNIST's "train" or "t10k" images, normalised, with their labels."""
    images = read_idx(f"{DATA}/{split}-images-idx3-ubyte.gz")
    labels = read_idx(f"{DATA}/{split}-labels-idx1-ubyte.gz").long()
    return torch.utils.data.TensorDataset(
        ((images.float() / 255.0 - 0.28604) / 0.32025).unsqueeze(1), labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    dataset = fashion_mnist("train")
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler,
                                         pin_memory=cuda)

    torch.manual_seed(0)
    model = fashion_resnet18()
    if cuda:
        model = model.to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
    # On CUDA Adam's fused kernel, the one train::optim::Adam takes there.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if cuda else {}))
    criterion = nn.CrossEntropyLoss()

    sampler.set_epoch(0)
    samples, start = 0, None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            start = time.perf_counter()
        if step == args.warmup + args.steps:
            break
        if cuda:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        if step >= args.warmup:
            samples += x.size(0)
    elapsed = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    totals = torch.tensor([samples / elapsed, rss], dtype=torch.float64, device=device)
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
