#!/usr/bin/env python3
"""Data-parallel throughput: FashionMNIST ResNet-18, 2 workers x 1 intra-op thread.

Runs, alternating, in this invocation:
  trainrun  -n 2 the fashion_mnist plugin (prepare_model + prepare_data_loader)
  torchrun  --nproc_per_node 2 the same loop in Python with DistributedDataParallel
  ceiling   trainrun -n 1, one thread, the same per-worker batch, times two
and prints steady-state samples/s (after warm-up), the ratios and peak RSS per
worker. Targets: trainrun >= 1.05x torchrun, >= 0.90 of the ceiling. With
--compression fp16 (or bf16) each round also runs trainrun with that gradient compression
(ModelOptions::compression) and prints its ratio to uncompressed trainrun;
--skip-torchrun leaves the torchrun baseline out (no PyTorch needed). --per-tensor
also runs trainrun with the optimizer and data path that came before train::optim and
train::TensorDataset (torch::optim's per-tensor Adam, images normalised per sample and
stacked: config kernels=per-tensor data=samples) and prints the ratio to it. --torchrun PATH
(repeatable) names the torchrun of each PyTorch to compare against, in the same
rounds: Debian's 1.13 (`torchrun`, the default) and pip's 2.x
(`/opt/trainrun-torch/bin/torchrun`, tools/setup_torch2.sh), say.
--gpu runs 1 worker on cuda:0 instead (trainrun --use-gpu against torchrun
--nproc_per_node 1 with DDP on NCCL; no ceiling; target >= 1.0); tools/gpu/run.sh
runs it on a GPU machine. --data-dir names the FashionMNIST folder for both.
--baseline-build DIR also runs trainrun -n 2 of another build (an earlier commit's,
say) in each round and prints the ratio to it (target >= 1.0: no slower than it).

  tools/bench/ddp_throughput.py [--build build] [--rounds 2] [--steps 30] [--warmup 5]
                                [--compression fp16|bf16] [--skip-torchrun] [--per-tensor]
                                [--torchrun PATH]... [--gpu] [--data-dir DIR]
                                [--baseline-build DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env):
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout.decode()[-3000:]}")
    return result.stdout.decode()


def trainrun(args, tmp, env, workers, name, compression="none", extra=(), build=None):
    build = build or args.build
    results = os.path.join(tmp, "results")
    placement = ["--use-gpu"] if args.gpu else ["--cpus-per-worker", "1"]
    data = ["--config", f"data_dir={args.data_dir}"] if args.data_dir else []
    run([os.path.join(build, "trainrun"), "--plugin",
         os.path.join(build, "plugins", "fashion_mnist", "libfashion_mnist.so"),
         "-n", str(workers), *placement, *data, "-q", "--storage-path", results,
         "--name", name, "--config", "epochs=1", "--config", "eval=false",
         "--config", "log_every=0", "--config", f"warmup_steps={args.warmup}",
         "--config", f"max_steps={args.warmup + args.steps}",
         "--config", f"compression={compression}", *extra], env)
    with open(os.path.join(results, name, "result.jsonl")) as f:
        metrics = json.loads(f.readlines()[-1])["metrics"]
    return metrics["samples_per_s"], metrics["peak_rss_mb"]


def torch_version(torchrun_path):
    """The PyTorch version of the interpreter a torchrun script runs with."""
    import shutil
    path = shutil.which(torchrun_path) or torchrun_path
    with open(path) as f:
        interpreter = f.readline()[2:].strip().split()
    out = subprocess.run(interpreter + ["-c", "import torch; print(torch.__version__)"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return out.stdout.strip() or "?"


def torchrun(args, tmp, env, name, torchrun_path):
    out = run([torchrun_path, "--nproc_per_node", "1" if args.gpu else "2",
               "--redirects", "2", "--tee", "1", "--log_dir", os.path.join(tmp, name),
               os.path.join(HERE, "ddp_torchrun.py"), "--warmup", str(args.warmup),
               "--steps", str(args.steps), "--device", "cuda" if args.gpu else "cpu"], env)
    line = next(l for l in out.splitlines() if "samples_per_s" in l)
    metrics = json.loads(line[line.index("{"):])
    return metrics["samples_per_s"], metrics["peak_rss_mb"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, help="timed steps (30; 300 with --gpu)")
    parser.add_argument("--warmup", type=int, help="steps before the timing (5; 30 with --gpu)")
    parser.add_argument("--gpu", action="store_true", help="1 worker on cuda:0 each side")
    parser.add_argument("--data-dir", help="the FashionMNIST folder (the Debian package's)")
    parser.add_argument("--compression", choices=["fp16", "bf16"])
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--per-tensor", action="store_true",
                        help="also run trainrun with per-tensor Adam and per-sample data")
    parser.add_argument("--torchrun", action="append", metavar="PATH",
                        help="a torchrun to compare against (repeatable; default: torchrun)")
    parser.add_argument("--baseline-build", metavar="DIR",
                        help="also trainrun of another build, to compare against")
    args = parser.parse_args()
    args.steps = args.steps or (300 if args.gpu else 30)
    args.warmup = args.warmup or (30 if args.gpu else 5)
    torchruns = [] if args.skip_torchrun else (args.torchrun or ["torchrun"])
    labels = {t: f"torchrun + DDP (PyTorch {torch_version(t)})" for t in torchruns}
    env = dict(os.environ) if args.gpu else dict(os.environ, OMP_NUM_THREADS="1")
    if args.data_dir:
        env["FASHION_MNIST_DIR"] = args.data_dir
    ours, ceiling, compressed, before, baseline = [], [], [], [], []
    theirs = {t: [] for t in torchruns}
    with tempfile.TemporaryDirectory() as tmp:
        env["TRAINRUN_CACHE_DIR"] = os.path.join(tmp, "cache")
        workers = 1 if args.gpu else 2
        for r in range(args.rounds):
            ours.append(trainrun(args, tmp, env, workers, f"ddp{r}"))
            line = f"round {r}: trainrun {ours[-1][0]:.1f}"
            if args.compression:
                compressed.append(trainrun(args, tmp, env, workers, f"{args.compression}{r}",
                                           args.compression))
                line += f"  {args.compression} {compressed[-1][0]:.1f}"
            if args.per_tensor:
                before.append(trainrun(args, tmp, env, workers, f"before{r}",
                                       extra=("--config", "kernels=per-tensor",
                                              "--config", "data=samples")))
                line += f"  per-tensor {before[-1][0]:.1f}"
            if args.baseline_build:
                baseline.append(trainrun(args, tmp, env, workers, f"baseline{r}",
                                         build=args.baseline_build))
                line += f"  baseline build {baseline[-1][0]:.1f}"
            for i, t in enumerate(torchruns):
                theirs[t].append(torchrun(args, tmp, env, f"torchrun{i}-{r}", t))
                line += f"  {labels[t]} {theirs[t][-1][0]:.1f}"
            if not args.gpu:
                one = trainrun(args, tmp, env, 1, f"one{r}")
                ceiling.append((2 * one[0], one[1]))
                line += f"  ceiling {ceiling[-1][0]:.1f}"
            print(f"{line} samples/s", flush=True)
    med = lambda rows, i: statistics.median(row[i] for row in rows)
    t = med(ours, 0)
    width = max([26] + [len(label) for label in labels.values()])
    shape = "1 worker on cuda:0" if args.gpu else "2 workers x 1 thread"
    print(f"FashionMNIST ResNet-18, {shape}, batch 128/worker, "
          f"{args.steps} steps after {args.warmup} warm-up (median of {args.rounds}):")
    print(f"  {'trainrun + prepare_model':<{width}} {t:7.1f} samples/s   "
          f"peak RSS/worker {med(ours, 1):6.0f} MB")
    if compressed:
        name = f"... with {args.compression} gradients"
        print(f"  {name:<{width}} {med(compressed, 0):7.1f} samples/s   "
              f"peak RSS/worker {med(compressed, 1):6.0f} MB")
    if before:
        name = "... per-tensor Adam, samples"
        print(f"  {name:<{width}} {med(before, 0):7.1f} samples/s   "
              f"peak RSS/worker {med(before, 1):6.0f} MB")
    if baseline:
        name = f"trainrun of {args.baseline_build}"
        print(f"  {name:<{width}} {med(baseline, 0):7.1f} samples/s   "
              f"peak RSS/worker {med(baseline, 1):6.0f} MB")
    for name, rows in theirs.items():
        print(f"  {labels[name]:<{width}} {med(rows, 0):7.1f} samples/s   "
              f"peak RSS/worker {med(rows, 1):6.0f} MB")
    if ceiling:
        c = med(ceiling, 0)
        print(f"  {'ceiling (1 worker x 2)':<{width}} {c:7.1f} samples/s   "
              f"peak RSS/worker {med(ceiling, 1):6.0f} MB")
    target = "1.0" if args.gpu else "1.05"
    for name, rows in theirs.items():
        print(f"  trainrun / {labels[name]} = {t / med(rows, 0):.3f}  (target >= {target})")
    if ceiling:
        print(f"  trainrun / ceiling  = {t / c:.3f}  (target >= 0.90)")
    if before:
        print(f"  trainrun / per-tensor Adam, samples = {t / med(before, 0):.3f}"
              "  (target >= 1.0)")
    if compressed:
        print(f"  {args.compression} / uncompressed = {med(compressed, 0) / t:.3f}")
    if baseline:
        print(f"  trainrun / trainrun of {args.baseline_build} = {t / med(baseline, 0):.3f}"
              "  (target >= 1.0)")

if __name__ == "__main__":
    main()
