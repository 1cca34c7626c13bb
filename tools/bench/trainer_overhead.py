#!/usr/bin/env python3
"""The cost of train::Trainer's loop: FashionMNIST ResNet-18, 2 workers x 1 thread.

Runs, alternating (each first in every other round), in this invocation:
  hand-written  plugins/fashion_mnist (its own loop; eval off)
  Trainer       examples/lightning_fashion_mnist (train::Trainer; no validation)
each for --warmup and for --warmup + --steps optimizer steps in one epoch, and
takes the time per step as the difference of the two runs' time to their last
report (so start-up, data loading and the final checkpoint cancel out).
Prints samples/s of each and Trainer / hand-written (target >= 0.98).

  tools/bench/trainer_overhead.py [--build build] [--rounds 3] [--steps 30] [--warmup 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BATCH = 128
WORKERS = 2


def last_report_time(args, tmp, plugin, name, config):
    results = os.path.join(tmp, "results")
    cmd = [os.path.join(args.build, "trainrun"), "--plugin", plugin, "-n", str(WORKERS),
           "--cpus-per-worker", "1", "-q", "--storage-path", results, "--name", name]
    for item in config:
        cmd += ["--config", item]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout.decode()[-3000:]}")
    with open(os.path.join(results, name, "result.jsonl")) as f:
        return json.loads(f.readlines()[-1])["time_total_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    hand = os.path.join(args.build, "plugins", "fashion_mnist", "libfashion_mnist.so")
    trainer = os.path.join(args.build, "examples", "lightning_fashion_mnist",
                           "liblightning_fashion_mnist.so")
    for path in (hand, trainer):
        if not os.path.exists(path):
            sys.exit(f"missing {path}: build first")

    def hand_config(steps):
        return ["epochs=1", "eval=false", "log_every=0", "warmup_steps=0", f"max_steps={steps}"]

    def trainer_config(steps):
        return ["epochs=1", "val_batches=0", f"max_steps={steps}"]

    per_step = {"hand-written": [], "Trainer": []}
    with tempfile.TemporaryDirectory() as tmp:
        run = 0
        for round_ in range(args.rounds):
            pair = [("hand-written", hand, hand_config), ("Trainer", trainer, trainer_config)]
            # ABBA: each goes first in every other round, so that an order effect cancels.
            for label, plugin, config in (pair if round_ % 2 == 0 else pair[::-1]):
                times = []
                for steps in (args.warmup, args.warmup + args.steps):
                    run += 1
                    times.append(last_report_time(args, tmp, plugin, f"r{run}", config(steps)))
                seconds = (times[1] - times[0]) / args.steps
                per_step[label].append(seconds)
                print(f"round {round_ + 1}: {label:<12} {WORKERS * BATCH / seconds:7.1f} samples/s",
                      flush=True)
    rate = {k: WORKERS * BATCH / statistics.median(v) for k, v in per_step.items()}
    print(f"FashionMNIST ResNet-18, {WORKERS} workers x 1 thread, batch {BATCH}/worker, "
          f"{args.steps} steps after {args.warmup}, median of {args.rounds} rounds:")
    for label, value in rate.items():
        print(f"  {label:<12} {value:7.1f} samples/s")
    print(f"  Trainer / hand-written = {rate['Trainer'] / rate['hand-written']:.3f}  "
          "(target >= 0.98)")


if __name__ == "__main__":
    main()
