#!/usr/bin/env python3
"""The FashionMNIST ResNet-18 step on one GPU: trainrun against Python, interleaved.

Each round runs, one after the other, at each batch size (128 and 512 by default):
  trainrun     trainrun -n 1 --use-gpu, the fashion_mnist plugin (train::optim's Adam,
               train::TensorDataset, prepare_model and prepare_data_loader)
  resident_tr  the same with the training set in GPU memory (config resident=true)
  captured_tr  the same with each step captured as a CUDA graph (config capture=true)
  torchrun     torchrun --nproc_per_node 1 ddp_torchrun.py: DDP on NCCL, a DataLoader
  loader       plain PyTorch, a DataLoader, no DDP        (plain_step.py --mode loader)
  resident     plain PyTorch, the dataset on the GPU       (plain_step.py --mode resident)
  graph        the same step captured as a CUDA graph      (plain_step.py --mode graph)
and with --trainer also, at the same place in each round:
  trainer      train::Trainer (examples/lightning_fashion_mnist), eager
  trainer_cap  the same with TrainerOptions::capture (config capture=true)
whose rate comes from two runs, to the warm-up's end and to the steps' end: the
difference of their times to the last report, so that start-up cancels out;
and prints min / median / max samples/s of each over the rounds, then the ratios of
the medians against the targets. GPU rounds move by +-15%: only medians of
interleaved rounds of one invocation mean anything. With --skip NAME (repeatable)
a side is left out; --device cpu runs the eager sides on the CPU with few steps, to
check the script itself.

  tools/bench/gpu_step.py [--build build] [--rounds 5] [--batch 128 --batch 512]
                          [--torchrun PATH] [--data-dir DIR] [--skip graph]... [--trainer]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = ["trainrun", "resident_tr", "captured_tr", "torchrun", "loader", "resident", "graph"]
TRAINER_SIDES = ["trainer", "trainer_cap"]
FASHION_PLUGIN = os.path.join("plugins", "fashion_mnist", "libfashion_mnist.so")
TRAINER_PLUGIN = os.path.join("examples", "lightning_fashion_mnist", "liblightning_fashion_mnist.so")
# The ratios of medians the GPU work is held to, at a batch size: (numerator,
# denominator, batch, target).
TARGETS = [("trainrun", "torchrun", 128, 1.3), ("trainrun", "resident", 128, 1.0),
           ("resident_tr", "resident", 128, 1.0), ("captured_tr", "graph", 128, 0.7),
           ("trainrun", "loader", 512, 1.3)]
# What the Trainer's loop costs, and what its capture buys (no targets).
TRAINER_RATIOS = [("trainer", "trainrun"), ("trainer_cap", "captured_tr"),
                  ("trainer_cap", "graph")]


def run(cmd, env):
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout.decode()[-3000:]}")
    return result.stdout.decode()


def json_line(out):
    line = next(l for l in reversed(out.splitlines()) if "samples_per_s" in l)
    return json.loads(line[line.index("{"):])["samples_per_s"]


def steps_for(args, batch):
    """Warm-up and timed steps within one epoch of 60000 images."""
    if args.device == "cpu":
        return 1, 3
    warmup, steps = args.warmup, args.steps
    while (warmup + steps) * batch > 60000:
        steps //= 2
    return warmup, steps


def last_report(args, tmp, env, plugin, run_name, config):
    """The last report of `trainrun -n 1` running `plugin` (a path under --build) as
    run_name, a name of its own: the same name again would resume that run."""
    results = os.path.join(tmp, "results")
    placement = ["--use-gpu"] if args.device == "cuda" else ["--cpus-per-worker", "1"]
    cmd = [os.path.join(args.build, "trainrun"), "--plugin", os.path.join(args.build, plugin),
           "-n", "1", *placement, "-q", "--storage-path", results, "--name", run_name]
    if args.data_dir:
        config = [f"data_dir={args.data_dir}", *config]
    for item in config:
        cmd += ["--config", item]
    run(cmd, env)
    with open(os.path.join(results, run_name, "result.jsonl")) as f:
        return json.loads(f.readlines()[-1])


def trainer_side(args, name, batch, tmp, env, serial):
    """samples/s of the Trainer's steps after the warm-up, from two runs' times."""
    warmup, steps = steps_for(args, batch)
    times = [last_report(args, tmp, env, TRAINER_PLUGIN, f"{name}{batch}-{serial}-{last}",
                         ["epochs=1", "val_batches=0", "log_every=0", f"batch_size={batch}",
                          f"max_steps={last}",
                          f"capture={'true' if name == 'trainer_cap' else 'false'}"])["time_total_s"]
             for last in (warmup, warmup + steps)]
    if times[1] - times[0] <= 0:
        sys.exit(f"{name} at batch {batch}: {warmup + steps} steps took no longer than {warmup} "
                 f"({times[1]:.2f} s against {times[0]:.2f} s): too few --steps to rate")
    return batch * steps / (times[1] - times[0])


def side(args, name, batch, tmp, env, serial):
    if name in TRAINER_SIDES:
        return trainer_side(args, name, batch, tmp, env, serial)
    warmup, steps = steps_for(args, batch)
    if name in ("trainrun", "resident_tr", "captured_tr"):
        return last_report(args, tmp, env, FASHION_PLUGIN, f"{name}{batch}-{serial}",
                           ["epochs=1", "eval=false", "log_every=0", f"batch_size={batch}",
                            f"warmup_steps={warmup}", f"max_steps={warmup + steps}",
                            f"resident={'true' if name == 'resident_tr' else 'false'}",
                            f"capture={'true' if name == 'captured_tr' else 'false'}"]
                           )["metrics"]["samples_per_s"]
    if name == "torchrun":
        return json_line(run([args.torchrun, "--nproc_per_node", "1", "--redirects", "2",
                              "--tee", "1", "--log_dir", os.path.join(tmp, f"log{batch}-{serial}"),
                              os.path.join(HERE, "ddp_torchrun.py"), "--warmup", str(warmup),
                              "--steps", str(steps), "--batch", str(batch),
                              "--device", args.device], env))
    return json_line(run([args.python, os.path.join(HERE, "plain_step.py"), "--mode", name,
                          "--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps),
                          "--device", args.device], env))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, action="append", help="128 and 512 by default")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--torchrun", default="torchrun")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--data-dir", help="the FashionMNIST folder (the Debian package's)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--skip", action="append", default=[], choices=SIDES + TRAINER_SIDES)
    parser.add_argument("--trainer", action="store_true",
                        help="also train::Trainer, eager and captured (two runs a side)")
    args = parser.parse_args()
    batches = args.batch or [128, 512]
    gpu_only = {"graph", "resident_tr", "captured_tr", "trainer_cap"}
    candidates = SIDES + (TRAINER_SIDES if args.trainer else [])
    sides = [s for s in candidates
             if s not in args.skip and not (s in gpu_only and args.device == "cpu")]
    env = dict(os.environ)
    if args.data_dir:
        env["FASHION_MNIST_DIR"] = args.data_dir
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    rows = {(s, b): [] for s in sides for b in batches}
    with tempfile.TemporaryDirectory() as tmp:
        env["TRAINRUN_CACHE_DIR"] = os.path.join(tmp, "cache")
        for r in range(args.rounds):
            for b in batches:
                line = []
                for s in sides:
                    rows[(s, b)].append(side(args, s, b, tmp, env, r))
                    line.append(f"{s} {rows[(s, b)][-1]:.0f}")
                print(f"round {r} batch {b}: " + "  ".join(line) + " samples/s", flush=True)
    print(f"FashionMNIST ResNet-18, 1 process on {args.device}, samples/s over {args.rounds} "
          "interleaved rounds (min / median / max):")
    median = {}
    for b in batches:
        for s in sides:
            values = rows[(s, b)]
            median[(s, b)] = statistics.median(values)
            print(f"  batch {b:4d}  {s:<11} {min(values):9.0f} {median[(s, b)]:9.0f} "
                  f"{max(values):9.0f}")
    for top, bottom, b, target in TARGETS:
        if (top, b) in median and (bottom, b) in median:
            print(f"  batch {b}: {top} / {bottom} = {median[(top, b)] / median[(bottom, b)]:.3f}"
                  f"  (target >= {target})")
    for top, bottom in TRAINER_RATIOS:
        for b in batches:
            if (top, b) in median and (bottom, b) in median:
                print(f"  batch {b}: {top} / {bottom} = "
                      f"{median[(top, b)] / median[(bottom, b)]:.3f}")
    for b in batches:
        if ("graph", b) in median and ("resident", b) in median:
            print(f"  batch {b}: graph / resident = "
                  f"{median[('graph', b)] / median[('resident', b)]:.3f}  (what capture buys Python)")


if __name__ == "__main__":
    main()
