#!/usr/bin/env python3
"""The Python image pipelines tools/bench/ingest.py measures trainrun's against.

Each reads --images photographs from the WebDataset shards --shards DIR
(tools/bench/make_photos.py), decodes them, takes a RandomResizedCrop of 224x224
(scale 0.08-1, ratio 3/4-4/3) flipped left to right half the time, normalises
it with ImageNet's mean and standard deviation into float32 CHW, and batches
256, with --threads 2 workers:
  torch  PyTorch's DataLoader (2 worker processes, pin_memory off) over
         webdataset's WebDataset, split between the workers by shard
         (split_by_worker), decoded to PIL and transformed by torchvision
  dali   NVIDIA DALI's pipeline on the CPU (device_id None, 2 threads):
         readers.webdataset (its index inferred from the tars),
         decoders.image_random_crop, resize, crop_mirror_normalize
  ray    Ray Data on a local Ray of 2 CPUs (127.0.0.1): read_webdataset, the
         torchvision transforms in map_batches, iter_torch_batches
No shuffling in any of them. Work read ahead past the last batch wanted (DALI
runs 2 batches ahead) counts in a run's CPU time, as trainrun's does in its.
Each prints one JSON line: images, seconds and first_batch_s from its own timer
(started after its imports, and for ray after ray.init, whose time is start_s),
and loop_cpu_s, the CPU time of its process tree over that timer (/proc: its
own and its children's, live and reaped). Ray's processes are not all reaped by
the driver, so ray also gives tree_cpu_s, the whole tree's CPU time from its
start (imports and ray.init included), read from /proc just before
ray.shutdown(). Where DALI cannot run without a GPU it prints
{"unavailable": "does not run without a GPU: <reason>"}.

  /opt/trainrun-ingest/bin/python tools/bench/ingest_baselines.py torch|dali|ray \\
      --shards DIR [--images 5120] [--batch 256] [--threads 2]
"""
import argparse
import glob
import json
import os
import sys
import time

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
SIZE = 224
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree(root):
    """Pids of `root` and its descendants, as /proc lists them now."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue  # it has gone
            children.setdefault(ppid, []).append(int(entry))
    pids, i = [root], 0
    while i < len(pids):
        pids += children.get(pids[i], [])
        i += 1
    return pids


def tree_cpu_s(root):
    """User and system CPU seconds of `root`'s tree: each live process's own and
    those of the children it reaped (a process that exited unreaped is missed)."""
    ticks = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / CLOCK_TICKS


class Timer:
    """The contender's own timer: started after its set-up, counts batches."""

    def __init__(self):
        self.began = time.perf_counter()
        self.cpu = tree_cpu_s(os.getpid())
        self.first = None
        self.images = 0

    def batch(self, count):
        self.images += count
        if self.first is None:
            self.first = time.perf_counter() - self.began

    def result(self):
        return {"images": self.images, "seconds": time.perf_counter() - self.began,
                "first_batch_s": self.first or 0.0,
                "loop_cpu_s": tree_cpu_s(os.getpid()) - self.cpu}


def shard_paths(directory):
    paths = sorted(glob.glob(os.path.join(directory, "train-*.tar")))
    if not paths:
        sys.exit(f"no shards train-*.tar in {directory}")
    return paths


def torchvision_transform():
    from torchvision import transforms
    return transforms.Compose([
        transforms.RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])


def run_torch(args):
    import torch.utils.data
    import webdataset as wds

    timer = Timer()
    dataset = (wds.WebDataset(shard_paths(args.shards), shardshuffle=False,
                              workersplitter=wds.split_by_worker)
               .decode("pil").to_tuple("jpg", "cls")
               .map_tuple(torchvision_transform(), lambda label: label))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch,
                                         num_workers=args.threads, pin_memory=False)
    for images, _ in loader:
        timer.batch(len(images))
        if timer.images >= args.images:
            break
    result = timer.result()
    del loader  # its workers stop here, before the process exits
    return result


def run_dali(args):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=args.batch, num_threads=args.threads, device_id=None, seed=0)
    def pipeline():
        jpegs, labels = fn.readers.webdataset(paths=shard_paths(args.shards), ext=["jpg", "cls"])
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(SCALE),
                                               random_aspect_ratio=list(RATIO))
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN],
                                          std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, labels

    timer = Timer()
    try:
        pipe = pipeline()
        pipe.build()
        outputs = pipe.run()
    except RuntimeError as error:
        text = str(error)
        if any(word in text for word in ("CUDA", "GPU", "cuda", "nvml", "NVML")):
            return {"unavailable": "does not run without a GPU: " + text.strip().splitlines()[0]}
        raise
    while True:
        timer.batch(len(outputs[0]))
        if timer.images >= args.images:
            break
        outputs = pipe.run()
    result = timer.result()
    del pipe
    return result


def run_ray(args):
    import numpy as np
    import ray
    import torch
    from PIL import Image
    import io

    began = time.perf_counter()
    ray.init(num_cpus=args.threads, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR", log_to_driver=False)
    start_s = time.perf_counter() - began
    transform = torchvision_transform()

    def augment(batch):
        images = [transform(Image.open(io.BytesIO(jpeg)).convert("RGB")).numpy()
                  for jpeg in batch["jpg"]]
        labels = [int(label) for label in batch["cls"]]
        return {"image": np.stack(images), "label": np.array(labels)}

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    timer = Timer()
    dataset = ray.data.read_webdataset(shard_paths(args.shards), decoder=None,
                                       suffixes=["jpg", "cls"]).map_batches(
                                           augment, batch_size=args.batch, batch_format="numpy")
    for batch in dataset.iter_torch_batches(batch_size=args.batch):
        assert batch["image"].dtype == torch.float32
        timer.batch(len(batch["image"]))
        if timer.images >= args.images:
            break
    result = timer.result()
    result["start_s"] = start_s
    result["tree_cpu_s"] = tree_cpu_s(os.getpid())
    ray.shutdown()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("contender", choices=["torch", "dali", "ray"])
    parser.add_argument("--shards", required=True, help="the directory of train-*.tar")
    parser.add_argument("--images", type=int, default=5120)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    run = {"torch": run_torch, "dali": run_dali, "ray": run_ray}[args.contender]
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
