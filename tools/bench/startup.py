#!/usr/bin/env python3
"""Startup benchmark: launch-to-exit wall time of a trivial 2-worker run.

trainrun: the quickstart plugin with steps=1 (a Gloo group, one report, return).
torchrun: --nproc_per_node 2 running init_process_group("gloo"); barrier().
Both run in this invocation, alternating, and the ratio of medians is printed.
Target: trainrun / torchrun <= 0.2.
With --local: the same run with one worker process against --local (the train
function in the trainrun process), both trainrun's; what --local costs.

  tools/bench/startup.py [--build build] [--repeats 5] [--local]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, env=None):
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout.decode()}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--local", action="store_true",
                        help="compare --local with one worker process instead")
    args = parser.parse_args()
    if args.local:
        compare_local(args)
        return

    trainrun = os.path.join(args.build, "trainrun")
    plugin = os.path.join(args.build, "examples", "quickstart", "libquickstart.so")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        ours, theirs = [], []
        for i in range(args.repeats + 1):  # the first round warms caches and is dropped
            t = timed([trainrun, "--plugin", plugin, "-n", "2", "--config", "steps=1", "-q",
                       "--storage-path", os.path.join(tmp, "results"), "--name", f"r{i}"], env)
            b = timed(["torchrun", "--nproc_per_node", "2", "--redirects", "2", "--tee", "1",
                       "--log_dir", os.path.join(tmp, f"logs{i}"),
                       os.path.join(HERE, "torchrun_trivial.py")])
            if i > 0:
                ours.append(t)
                theirs.append(b)
    t, b = statistics.median(ours), statistics.median(theirs)
    print(f"startup, 2 workers, launch to exit (median of {args.repeats}):")
    print(f"  trainrun  {t:7.3f} s   runs: {' '.join(f'{x:.3f}' for x in ours)}")
    print(f"  torchrun  {b:7.3f} s   runs: {' '.join(f'{x:.3f}' for x in theirs)}")
    print(f"  ratio trainrun/torchrun = {t / b:.3f}  (target <= 0.2)")


def compare_local(args):
    trainrun = os.path.join(args.build, "trainrun")
    plugin = os.path.join(args.build, "examples", "quickstart", "libquickstart.so")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        times = {"worker": [], "local": []}
        for i in range(args.repeats + 1):  # the first round warms caches and is dropped
            for mode in times:
                cmd = [trainrun, "--plugin", plugin, "--config", "steps=1", "-q",
                       "--storage-path", os.path.join(tmp, "results"), "--name", f"{mode}{i}"]
                t = timed(cmd + (["--local"] if mode == "local" else []), env)
                if i > 0:
                    times[mode].append(t)
    w, l = statistics.median(times["worker"]), statistics.median(times["local"])
    print(f"startup, 1 rank, launch to exit (median of {args.repeats}):")
    print(f"  -n 1     {w:7.3f} s   runs: {' '.join(f'{x:.3f}' for x in times['worker'])}")
    print(f"  --local  {l:7.3f} s   runs: {' '.join(f'{x:.3f}' for x in times['local'])}")
    print(f"  ratio --local / -n 1 = {l / w:.3f}")


if __name__ == "__main__":
    main()
