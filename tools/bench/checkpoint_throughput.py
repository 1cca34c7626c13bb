#!/usr/bin/env python3
"""Checkpoint commit throughput: 2 ranks x 512 MiB through trainrun vs `cp -r`.

Each rank reports a directory with one 512 MiB shard, written beforehand (the
same files cp copies); rank 0 times
report() until the checkpoint is committed (copied or streamed, hashed,
fsynced, manifest, rename, state). Two paths: the shared-filesystem one (local
workers copy their files into storage themselves) and the streamed one
(`--checkpoint-upload stream`: chunks through the controller's socket). The
baseline copies the same amount with `cp -r` followed by `sync` on the same
disk, in this invocation. Targets: shared >= 0.95x cp, streamed >= 0.8x cp.

  tools/bench/checkpoint_throughput.py [--build build] [--mb 512] [--rounds 5]
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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    total = 2 * args.mb / 1024.0  # GiB
    ours, streamed, cps = [], [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))
        src = os.path.join(tmp, "src")
        block = bytes((i * 2654435761 >> 24) & 0xFF for i in range(1 << 20))
        for rank in range(2):  # rank R reports src/rankR; cp copies all of src
            os.makedirs(os.path.join(src, f"rank{rank}"))
            with open(os.path.join(src, f"rank{rank}", f"shard-rank={rank}.bin"), "wb") as f:
                for _ in range(args.mb):
                    f.write(block)
        def settle():
            # Earlier rounds' writes and deletions (discards) finish first, so
            # each measurement starts from a quiet disk.
            subprocess.run(["sync"], check=True)
            time.sleep(2)

        def commit_seconds(name, *extra):
            cmd = [os.path.join(args.build, "trainrun"), "--plugin",
                   os.path.join(args.build, "tests", "plugins", "libtest_plugin.so"),
                   "--entry", "big_checkpoint", "-n", "2", "-q", "--storage-path",
                   os.path.join(tmp, "results"), "--name", name, "--config", f"source={src}",
                   *extra]
            settle()
            result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                sys.exit(result.stdout.decode())
            with open(os.path.join(tmp, "results", name, "result.jsonl")) as f:
                seconds = json.loads(f.readlines()[-1])["metrics"]["commit_s"]
            subprocess.run(["rm", "-rf", os.path.join(tmp, "results", name)], check=True)
            return seconds

        for r in range(args.rounds):
            ours.append(commit_seconds(f"ckpt{r}"))
            streamed.append(commit_seconds(f"stream{r}", "--checkpoint-upload", "stream"))
            settle()
            dst = os.path.join(tmp, f"dst{r}")
            start = time.perf_counter()
            subprocess.run(["cp", "-r", src, dst], check=True)
            subprocess.run(["sync"], check=True)
            cps.append(time.perf_counter() - start)
            subprocess.run(["rm", "-rf", dst], check=True)
            print(f"round {r}: trainrun shared {ours[-1]:.2f} s  streamed {streamed[-1]:.2f} s  "
                  f"cp -r + sync {cps[-1]:.2f} s", flush=True)
    t, s, c = statistics.median(ours), statistics.median(streamed), statistics.median(cps)
    print(f"checkpoint of {total:.0f} GiB (2 ranks x {args.mb} MiB), median of {args.rounds}:")
    print(f"  trainrun report() until committed, shared   {t:6.2f} s  {total / t:5.2f} GiB/s")
    print(f"  trainrun report() until committed, streamed {s:6.2f} s  {total / s:5.2f} GiB/s")
    print(f"  cp -r + sync                                {c:6.2f} s  {total / c:5.2f} GiB/s")
    print(f"  ratio shared/cp throughput   = {c / t:.2f}  (target >= 0.95)")
    print(f"  ratio streamed/cp throughput = {c / s:.2f}  (target >= 0.80)")


if __name__ == "__main__":
    main()
