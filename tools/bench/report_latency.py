#!/usr/bin/env python3
"""report() latency: 2 workers, metrics only, against a Gloo barrier in the same run.

Each rank calls train::report N times (a barrier through the controller that
records rank 0's metrics), and first process_group()->barrier() N times as the
baseline. Prints p50 and p99 of both and the ratio. Target: report p50 <= 200 us.

  tools/bench/report_latency.py [--build build] [-n 2000]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        cmd = [os.path.join(args.build, "trainrun"), "--plugin",
               os.path.join(args.build, "tests", "plugins", "libtest_plugin.so"),
               "--entry", "report_latency", "-n", "2", "-q", "--cpus-per-worker", "1",
               "--storage-path", tmp, "--name", "latency", "--config", f"n={args.n}"]
        result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.exit(result.stdout.decode())
        with open(os.path.join(tmp, "latency", "result.jsonl")) as f:
            m = json.loads(f.readlines()[-1])["metrics"]
    print(f"report() latency, 2 workers, metrics only ({args.n} calls each):")
    print(f"  train::report        p50 {m['report_p50_us']:7.1f} us   p99 {m['report_p99_us']:7.1f} us")
    print(f"  Gloo barrier (base)  p50 {m['barrier_p50_us']:7.1f} us   p99 {m['barrier_p99_us']:7.1f} us")
    print(f"  ratio report/barrier p50 = {m['report_p50_us'] / m['barrier_p50_us']:.2f}"
          f"   (target: report p50 <= 200 us)")


if __name__ == "__main__":
    main()
