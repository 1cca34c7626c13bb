#!/usr/bin/env python3
"""Asynchronous checkpoint upload: how long report() blocks, and what an upload costs training.

2 local ranks compute (a 256x256 matmul step, one thread each) and every few
seconds report a checkpoint of one 512 MiB shard per rank (1 GiB in all),
written beforehand, in each upload mode (the test plugin's checkpoint_overlap
entry). For each checkpoint rank 0 measures the time report() blocks, its
steps/s over 2 s before the report, and with async its steps/s from the
report's return until its handed-over directory is uploaded and deleted.
Both modes run in this invocation, alternating, `--rounds` runs of
`--checkpoints` checkpoints each; medians. Targets: async blocking <= 10% of
sync, steps/s during an upload within 10% of steps/s without one.

  tools/bench/async_checkpoint.py [--build build] [--mb 512] [--rounds 3]
                                  [--checkpoints 3] [--stream]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--stream", action="store_true",
                        help="stream the files through the controller (--checkpoint-upload stream)")
    args = parser.parse_args()
    runs = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"))

        def run(mode, name):
            work = os.path.join(tmp, "work")
            cmd = [os.path.join(args.build, "trainrun"), "--plugin",
                   os.path.join(args.build, "tests", "plugins", "libtest_plugin.so"),
                   "--entry", "checkpoint_overlap", "-n", "2", "-q", "--storage-path",
                   os.path.join(tmp, "results"), "--name", name, "--config", f"dir={work}",
                   "--config", f"mb={args.mb}", "--config", f"checkpoints={args.checkpoints}",
                   "--config", f"upload_mode={mode}"]
            if args.stream:
                cmd += ["--checkpoint-upload", "stream"]
            result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                sys.exit(result.stdout.decode())
            with open(os.path.join(tmp, "results", name, "result.jsonl")) as f:
                reports = [json.loads(line) for line in f if '"metrics"' in line]
            shutil.rmtree(os.path.join(tmp, "results", name))
            shutil.rmtree(work)
            return reports[-1]["metrics"]

        for r in range(args.rounds):
            for mode in ("sync", "async"):
                m = run(mode, f"{mode}{r}")
                runs[mode].append(m)
                during = (f"  during upload {m['steps_per_s_during']:.1f} steps/s"
                          f" (upload {m['upload_s']:.2f} s)" if mode == "async" else "")
                print(f"round {r} {mode:5}: report blocks {m['blocked_s'] * 1000:8.1f} ms"
                      f"  before {m['steps_per_s_before']:.1f} steps/s{during}", flush=True)

    def median(mode, key):
        return statistics.median(m[key] for m in runs[mode])

    sync_blocked, async_blocked = median("sync", "blocked_s"), median("async", "blocked_s")
    before, during = median("async", "steps_per_s_before"), median("async", "steps_per_s_during")
    path = "streamed" if args.stream else "copied"
    print(f"checkpoint of {2 * args.mb} MiB (2 ranks x {args.mb} MiB, {path}), "
          f"median of {args.rounds} runs x {args.checkpoints} checkpoints:")
    print(f"  report() blocks, sync    {sync_blocked * 1000:9.1f} ms")
    print(f"  report() blocks, async   {async_blocked * 1000:9.1f} ms"
          f"  (upload after it: {median('async', 'upload_s'):.2f} s)")
    print(f"  steps/s without upload {before:.1f}, during async upload {during:.1f}")
    print(f"  ratio async/sync blocking        = {async_blocked / sync_blocked:.3f}  (target <= 0.10)")
    print(f"  ratio steps/s during/without     = {during / before:.3f}  (target >= 0.90)")


if __name__ == "__main__":
    main()
