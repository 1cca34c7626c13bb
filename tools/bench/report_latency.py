#!/usr/bin/env python3
"""report() latency: 2 workers, metrics only, against a Gloo barrier in the same run.

Each rank calls train::report N times (a barrier through the controller that
records rank 0's metrics), and first process_group()->barrier() N times as the
baseline. Prints p50 and p99 of both and the ratio. Target: report p50 <= 200 us.
With --tensorboard-rounds R it runs R rounds with TensorBoard's event file (the
default) and R without (--no-tensorboard), interleaved, and prints the medians
of their report p50s and the ratio: what writing the events costs a report.

  tools/bench/report_latency.py [--build build] [-n 2000] [--tensorboard-rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def measure(build, n, extra):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        cmd = [os.path.join(build, "trainrun"), "--plugin",
               os.path.join(build, "tests", "plugins", "libtest_plugin.so"),
               "--entry", "report_latency", "-n", "2", "-q", "--cpus-per-worker", "1",
               "--storage-path", tmp, "--name", "latency", "--config", f"n={n}", *extra]
        result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.exit(result.stdout.decode())
        with open(os.path.join(tmp, "latency", "result.jsonl")) as f:
            return json.loads(f.readlines()[-1])["metrics"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--tensorboard-rounds", type=int, default=0)
    args = parser.parse_args()
    if args.tensorboard_rounds > 0:
        on, off = [], []
        for _ in range(args.tensorboard_rounds):
            on.append(measure(args.build, args.n, [])["report_p50_us"])
            off.append(measure(args.build, args.n, ["--no-tensorboard"])["report_p50_us"])
        print(f"train::report p50, 2 workers, {args.n} calls, {args.tensorboard_rounds} rounds each:")
        print(f"  with TensorBoard events  median {statistics.median(on):7.1f} us  "
              f"(rounds: {', '.join(f'{v:.1f}' for v in on)})")
        print(f"  --no-tensorboard         median {statistics.median(off):7.1f} us  "
              f"(rounds: {', '.join(f'{v:.1f}' for v in off)})")
        print(f"  ratio with/without = {statistics.median(on) / statistics.median(off):.3f}")
        return
    m = measure(args.build, args.n, [])
    print(f"report() latency, 2 workers, metrics only ({args.n} calls each):")
    print(f"  train::report        p50 {m['report_p50_us']:7.1f} us   p99 {m['report_p99_us']:7.1f} us")
    print(f"  Gloo barrier (base)  p50 {m['barrier_p50_us']:7.1f} us   p99 {m['barrier_p99_us']:7.1f} us")
    print(f"  ratio report/barrier p50 = {m['report_p50_us'] / m['barrier_p50_us']:.2f}"
          f"   (target: report p50 <= 200 us)")


if __name__ == "__main__":
    main()
