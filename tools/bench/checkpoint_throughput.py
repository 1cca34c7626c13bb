#!/usr/bin/env python3
"""Checkpoint commit throughput: 2 ranks x 512 MiB through trainrun vs `cp -r`.

Each rank writes one 512 MiB shard and calls train::report with it; rank 0 times
report() until the checkpoint is committed (copied, fsynced, hashed, manifest,
rename, state). The baseline copies the same amount with `cp -r` followed by
`sync` on the same disk, in this invocation. Local workers share the
controller's filesystem, so this measures the shared-filesystem path.
Target: >= 0.95x cp.

  tools/bench/checkpoint_throughput.py [--build build] [--mb 512] [--rounds 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    total = 2 * args.mb / 1024.0  # GiB
    ours, cps = [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        block = bytes((i * 2654435761 >> 24) & 0xFF for i in range(1 << 20))
        for rank in range(2):
            with open(os.path.join(src, f"shard-rank={rank}.bin"), "wb") as f:
                for _ in range(args.mb):
                    f.write(block)
        for r in range(args.rounds):
            name = f"ckpt{r}"
            cmd = [os.path.join(args.build, "trainrun"), "--plugin",
                   os.path.join(args.build, "tests", "plugins", "libtest_plugin.so"),
                   "--entry", "big_checkpoint", "-n", "2", "-q", "--storage-path",
                   os.path.join(tmp, "results"), "--name", name, "--config", f"mb={args.mb}"]
            result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                sys.exit(result.stdout.decode())
            with open(os.path.join(tmp, "results", name, "result.jsonl")) as f:
                ours.append(json.loads(f.readlines()[-1])["metrics"]["commit_s"])
            subprocess.run(["rm", "-rf", os.path.join(tmp, "results", name)], check=True)
            dst = os.path.join(tmp, f"dst{r}")
            start = time.perf_counter()
            subprocess.run(["cp", "-r", src, dst], check=True)
            subprocess.run(["sync"], check=True)
            cps.append(time.perf_counter() - start)
            subprocess.run(["rm", "-rf", dst], check=True)
            print(f"round {r}: trainrun {ours[-1]:.2f} s  cp -r + sync {cps[-1]:.2f} s", flush=True)
    t, c = statistics.median(ours), statistics.median(cps)
    print(f"checkpoint of {total:.0f} GiB (2 ranks x {args.mb} MiB), median of {args.rounds}:")
    print(f"  trainrun report() until committed  {t:6.2f} s  {total / t:5.2f} GiB/s")
    print(f"  cp -r + sync                       {c:6.2f} s  {total / c:5.2f} GiB/s")
    print(f"  ratio trainrun/cp throughput = {c / t:.2f}  (target >= 0.95 shared filesystem)")


if __name__ == "__main__":
    main()
