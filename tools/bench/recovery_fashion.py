#!/usr/bin/env python3
"""What a failure costs a real training: FashionMNIST on ResNet-18, killed and recovered.

examples/lightning_fashion_mnist (train::Trainer, Adam 1e-3), or with --loop own
plugins/fashion_mnist (a loop of its own over loader.epochs(), train::optim's
Adam 1e-3), on 3 workers of this host: EPOCHS epochs of --batches batches of 32
per rank, a checkpoint at each epoch's end, validated on --val-batches batches
per rank of the test set.
Each round runs it four ways, in turn:
  undisturbed;
  undisturbed with --recovery in-place (what its per-step vote costs);
  rank 1 killed -9 at a random point of epoch 1 (seeded: the same point for
  both), recovered by --recovery restart (the group restarts from the epoch's
  checkpoint);
  the same kill, recovered by --recovery in-place (the survivors go on, and a
  replacement catches up from rank 0 at a step boundary).
It prints for each: the run's time, the optimizer steps done twice, the time
from the kill to the survivors' next step, the replacement's catch-up time
(kill to its first step with the group) and the final accuracy; then the
in-place run's accuracy and time against the undisturbed run's.

  tools/bench/recovery_fashion.py [--build build] [--rounds 1] [--batches 40] [--loop own]
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

EPOCHS = 2
STEP_LINE = re.compile(r"^\[rank 0 [^\]]*\] epoch (\d+) step (\d+)/\d+[: ]")


def children_with_index(parent, index):
    """Pids of `parent`'s children started with --index `index`, oldest first."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == parent and b"--index" in args and args[args.index(b"--index") + 1] == str(
                index).encode():
            found.append(int(pid))
    return sorted(found)


def run(cmd, env, deadline_s, kill_fraction=None, run_dir=None):
    """Runs `cmd`; with kill_fraction, kill -9s rank 1 that far into epoch 1.

    Returns (seconds, lines as (time, text), the kill's time or None)."""
    lines = []
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    reader = threading.Thread(
        target=lambda: [lines.append((time.time(), line.rstrip("\n"))) for line in proc.stdout])
    reader.start()
    killed = None
    try:
        if kill_fraction is not None:
            result = os.path.join(run_dir, "result.jsonl")
            while time.time() - began < deadline_s:  # epoch 0's report
                if os.path.exists(result) and os.path.getsize(result) > 0:
                    break
                time.sleep(0.05)
            epoch = time.time() - began
            time.sleep(kill_fraction * epoch)
            victims = children_with_index(proc.pid, 1)
            if not victims:
                sys.exit("rank 1's worker was not found")
            killed = time.time()
            os.kill(victims[0], signal.SIGKILL)
        code = proc.wait(timeout=deadline_s)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join()
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n{tail}")
    return time.time() - began, lines, killed


def steps_at(lines, until):
    """rank 0's last (epoch, step) printed before `until`."""
    last = (0, 0)
    for when, text in lines:
        match = STEP_LINE.match(text)
        if match and when <= until:
            last = (int(match[1]), int(match[2]))
    return last


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--val-batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loop", choices=["trainer", "own"], default="trainer")
    args = parser.parse_args()
    trainrun = os.path.join(args.build, "trainrun")
    if args.loop == "trainer":
        plugin = os.path.join(args.build, "examples", "lightning_fashion_mnist",
                              "liblightning_fashion_mnist.so")
        options = {"train_batches": args.batches, "val_batches": args.val_batches}
    else:
        plugin = os.path.join(args.build, "plugins", "fashion_mnist", "libfashion_mnist.so")
        options = {"max_steps": args.batches, "eval_steps": args.val_batches}
    chooser = random.Random(args.seed)
    rows = {"undisturbed": [], "in-place, no kill": [], "restart": [], "in-place": []}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"),
                   OMP_NUM_THREADS="1")
        results = os.path.join(tmp, "results")
        for i in range(args.rounds):
            fraction = chooser.uniform(0.2, 0.7)
            for mode in rows:
                name = f"{mode.replace(', no kill', '-quiet')}{i}"
                kills = mode in ("restart", "in-place")
                cmd = [trainrun, "--plugin", plugin, "-n", "3", "--name", name,
                       "--storage-path", results, "--cpus-per-worker", "1",
                       "--config", f"epochs={EPOCHS}", "--config", "batch_size=32",
                       "--config", "log_every=1"]
                for key, value in options.items():
                    cmd += ["--config", f"{key}={value}"]
                if mode != "undisturbed":
                    cmd += ["--max-failures", "1", "--recovery", mode.split(",")[0]]
                run_dir = os.path.join(results, name)
                seconds, lines, killed = run(cmd, env, 1800, fraction if kills else None, run_dir)
                with open(os.path.join(run_dir, "result.jsonl")) as f:
                    reports = [json.loads(line) for line in f if line.strip()]
                with open(os.path.join(run_dir, "run.json")) as f:
                    info = json.load(f)
                if args.loop == "trainer":
                    steps = reports[-1]["metrics"]["step"]
                else:  # rank 0's steps in each epoch, from the last report of each
                    steps = sum({r["metrics"]["epoch"]: r["metrics"]["steps"]
                                 for r in reports}.values())
                row = {"seconds": seconds, "accuracy": reports[-1]["metrics"]["accuracy"],
                       "steps": steps, "twice": 0, "next": None, "caught_up": None}
                if mode == "restart":
                    epoch, step = steps_at(lines, killed)
                    # The restart resumes from epoch 0's checkpoint: the steps
                    # of epoch 1 done before the kill are done again.
                    row["twice"] = step if epoch == 1 else 0
                    restarted = min(when for when, text in lines if "attempt 2/" in text)
                    row["next"] = min(when for when, text in lines
                                      if when > restarted and STEP_LINE.match(text)) - killed
                elif mode == "in-place":
                    recovery = info["attempts"][0]["recoveries"][0]
                    row["twice"] = recovery["steps_lost"]
                    row["next"] = recovery["seconds"]
                    row["caught_up"] = recovery.get("caught_up_seconds")
                rows[mode].append(row)

    def median(mode, key):
        values = [r[key] for r in rows[mode] if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    loop = "train::Trainer" if args.loop == "trainer" else "a loop over loader.epochs()"
    print(f"FashionMNIST ResNet-18 ({loop}), 3 workers, {EPOCHS} epochs of {args.batches} batches "
          f"(a checkpoint each), rank 1 killed -9 in epoch 1 (median of {args.rounds}):")
    for mode in rows:
        print(f"  {mode:17s} run {median(mode, 'seconds'):7.1f} s, optimizer steps "
              f"{median(mode, 'steps'):g}, done twice {median(mode, 'twice'):g}, kill to the "
              f"survivors' next step {median(mode, 'next'):.3f} s, replacement caught up "
              f"{median(mode, 'caught_up'):.3f} s, accuracy {median(mode, 'accuracy'):.4f}")
    base = median("undisturbed", "accuracy")
    print(f"  accuracy in-place - undisturbed = {median('in-place', 'accuracy') - base:+.4f}, "
          f"restart - undisturbed = {median('restart', 'accuracy') - base:+.4f}")
    print(f"  ratio in-place, no kill/undisturbed (run time) = "
          f"{median('in-place, no kill', 'seconds') / median('undisturbed', 'seconds'):.3f}")
    print(f"  ratio in-place/undisturbed (run time) = "
          f"{median('in-place', 'seconds') / median('undisturbed', 'seconds'):.3f}, "
          f"restart/undisturbed = "
          f"{median('restart', 'seconds') / median('undisturbed', 'seconds'):.3f}")


if __name__ == "__main__":
    main()
