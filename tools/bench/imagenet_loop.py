#!/usr/bin/env python3
"""The ImageNet example's training loop fed by the image loader, against the
same model fed by synthetic tensors already in memory.

Makes --images JPEG photographs of ImageNet's size in shards
(tools/bench/make_photos.py, or --shards DIR), then in one invocation, in
interleaved rounds, runs examples/imagenet on one worker of --cores threads:
  loader     --config data=SHARDS: RandomResizedCrop, flip, uint8 batches
             from the loader's threads (its default: one thread on the CPU)
  synthetic  --config synthetic=N: random uint8 images in memory, batches
             gathered from them, the same normalisation on the device
Both run --steps steps of --batch images of --size pixels after 5 steps of
warm-up, and report the example's samples_per_s (from the start of step 5 to
the start of the last). Prints the medians and loader / synthetic (target >=
0.95: the loader costs the step almost nothing).

  /opt/trainrun-ingest/bin/python tools/bench/imagenet_loop.py [--build build-torch2]
      [--rounds 3] [--batch 32] [--size 224] [--steps 20] [--cores 2]
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(build, storage, name, config, cores, steps, batch, size, timeout):
    command = [os.path.join(build, "trainrun"), "--plugin",
               os.path.join(build, "examples", "imagenet", "libimagenet.so"), "-n", "1",
               "--cpus-per-worker", str(cores), "--storage-path", storage, "--name", name,
               "--num-to-keep", "1",
               "--config", f"batch_size={batch}", "--config", f"image_size={size}",
               "--config", f"max_steps={steps + 5}", "--config", "warmup=5",
               "--config", "classes=1000", "--config", "log_every=1000"] + config
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"{name} failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    lines = [json.loads(line) for line in open(os.path.join(storage, name, "result.jsonl"))]
    metrics = [line["metrics"] for line in lines if "metrics" in line]
    return metrics[-1]["samples_per_s"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build-torch2")
    parser.add_argument("--shards", help="a folder of train-*.tar (default: made here)")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="trainrun-imagenet-loop-")
    try:
        shards = args.shards
        if not shards:
            shards = os.path.join(tmp, "shards")
            subprocess.run([sys.executable, os.path.join(HERE, "make_photos.py"), shards,
                            "--images", str(args.images), "--per-shard", "256"], check=True)
        count = len(glob.glob(os.path.join(shards, "train-*.tar")))
        spec = os.path.join(shards, "train-{%06d..%06d}.tar" % (0, count - 1))
        contenders = {"loader": [f"--config", f"data={spec}"],
                      "synthetic": ["--config", f"synthetic={args.batch * 8}"]}
        results = {name: [] for name in contenders}
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                rate = run(args.build, os.path.join(tmp, "runs"), f"{name}-{r}", contenders[name],
                           args.cores, args.steps, args.batch, args.size, args.timeout)
                results[name].append(rate)
                print(f"round {r + 1} {name}: {rate:.2f} samples/s", flush=True)
        medians = {name: statistics.median(rates) for name, rates in results.items()}
        print(f"ResNet-50, batch {args.batch}, {args.size}x{args.size}, {args.steps} timed steps, "
              f"1 worker of {args.cores} threads ({args.build}), {args.rounds} rounds, medians:")
        for name, median in medians.items():
            print(f"  {name:10} {median:8.2f} samples/s  (rounds: "
                  f"{', '.join(f'{x:.2f}' for x in results[name])})")
        print(f"loader / synthetic: {medians['loader'] / medians['synthetic']:.3f} "
              "(target >= 0.95)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
