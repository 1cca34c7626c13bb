#!/usr/bin/env python3
"""Checkpoints in S3-compatible object storage: trainrun against boto3.

Starts SeaweedFS (tests/s3/s3tool.py, on loopback) and, alternating which goes
first each round, in this invocation:
  trainrun  a 2-rank run whose ranks each checkpoint --mb MiB (the test
            plugin's `transfer` entry): report()'s time is the upload (both
            ranks' parts in parallel, then the commit); a rerun's
            get_checkpoint() is the download (parallel ranged reads, sha256
            checked, once for the host)
  boto3     the same two files uploaded at once with upload_file, then
            downloaded with download_file (multipart, its default
            TransferConfig: 8 MiB parts, 10 threads each)
Prints MiB/s of each, trainrun / boto3 for upload and download (target >= 1.0),
and report()'s blocking time with asynchronous upload.

Run it with the Python that has boto3 (tools/setup_s3.sh):
  /opt/trainrun-s3/bin/python tools/bench/s3_transfer.py [--build build] [--mb 512] [--rounds 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tests", "s3", "s3tool.py")
RANKS = 2


def start_server(tmp):
    server = subprocess.Popen([sys.executable, TOOL, "serve", os.path.join(tmp, "s3")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    endpoint = server.stdout.readline().strip()
    if not endpoint:
        sys.exit("the S3 server did not start; see " + os.path.join(tmp, "s3", "weed.log"))
    sys.path.insert(0, os.path.dirname(TOOL))
    import s3tool
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=s3tool.ACCESS_KEY,
                      AWS_SECRET_ACCESS_KEY=s3tool.SECRET_KEY, AWS_REGION="us-east-1")
    s3tool.client().create_bucket(Bucket="bench")
    return server, s3tool


def timings(path):
    values = {}
    with open(path) as f:
        for line in f:
            key, value = line.split()
            values.setdefault(key, []).append(float(value))
    return values


def trainrun(args, tmp, name, config):
    out = os.path.join(tmp, name + ".timings")
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache-" + name))
    cmd = [os.path.join(args.build, "trainrun"), "--plugin", args.plugin, "--entry", "transfer",
           "-n", str(RANKS), "-q", "--storage-path", "s3://bench/runs", "--name", name,
           "--config", "mb=%d" % args.mb, "--config", "timings=" + out]
    for item in config:
        cmd += ["--config", item]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (result.returncode, " ".join(cmd),
                                         result.stdout.decode()[-3000:]))
    shutil.rmtree(env["TRAINRUN_CACHE_DIR"], ignore_errors=True)
    return timings(out)


def boto3_round(s3tool, tmp, mb, name):
    client = s3tool.client()
    files = []
    block = os.urandom(1 << 20)
    for rank in range(RANKS):
        path = os.path.join(tmp, "boto3-%d.bin" % rank)
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(block)
        files.append(path)

    def at_once(work):
        threads = [threading.Thread(target=work, args=(rank,)) for rank in range(RANKS)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - start

    up = at_once(lambda r: client.upload_file(files[r], "bench", "%s/pad-%d.bin" % (name, r)))
    down = at_once(lambda r: client.download_file("bench", "%s/pad-%d.bin" % (name, r),
                                                  files[r] + ".down"))
    for path in files:
        os.remove(path)
        os.remove(path + ".down")
    return up, down


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--mb", type=int, default=512, help="MiB per rank (default 512: 1 GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.plugin = os.path.join(args.build, "tests", "plugins", "libtest_plugin.so")
    if not os.path.exists(args.plugin):
        sys.exit("no %s: build with TRAINRUN_BUILD_TESTS=ON" % args.plugin)
    total = RANKS * args.mb
    tmp = tempfile.mkdtemp(prefix="trainrun-s3-bench-")
    server, s3tool = start_server(tmp)
    results = {k: [] for k in ("tr_up", "tr_down", "b_up", "b_down", "sync_block", "async_block")}
    try:
        for round_ in range(args.rounds):
            def ours():
                name = "r%d" % round_
                up = trainrun(args, tmp, name, ["reports=1"])["report_s"][0]
                down = trainrun(args, tmp, name, ["reports=0"])["get_checkpoint_s"][0]
                results["tr_up"].append(total / up)
                results["tr_down"].append(total / down)
                results["sync_block"].append(up)
                blocked = trainrun(args, tmp, name + "-async", ["reports=1", "upload_mode=async"])
                results["async_block"].append(blocked["report_s"][0])

            def theirs():
                up, down = boto3_round(s3tool, tmp, args.mb, "boto3-%d" % round_)
                results["b_up"].append(total / up)
                results["b_down"].append(total / down)

            for side in ((ours, theirs) if round_ % 2 == 0 else (theirs, ours)):
                side()
            print("round %d: upload trainrun %.0f boto3 %.0f MiB/s, download trainrun %.0f boto3 "
                  "%.0f MiB/s" % (round_, results["tr_up"][-1], results["b_up"][-1],
                                  results["tr_down"][-1], results["b_down"][-1]), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    m = {k: statistics.median(v) for k, v in results.items()}
    print("Checkpoint of %d MiB (%d ranks x %d MiB) to SeaweedFS on loopback, median of %d:"
          % (total, RANKS, args.mb, args.rounds))
    print("  upload    trainrun %7.1f MiB/s   boto3 upload_file   %7.1f MiB/s   ratio %.2f"
          "  (target >= 1.0)" % (m["tr_up"], m["b_up"], m["tr_up"] / m["b_up"]))
    print("  download  trainrun %7.1f MiB/s   boto3 download_file %7.1f MiB/s   ratio %.2f"
          "  (target >= 1.0)" % (m["tr_down"], m["b_down"], m["tr_down"] / m["b_down"]))
    print("  report() blocks %.2f s with a synchronous upload, %.3f s with an asynchronous one"
          % (m["sync_block"], m["async_block"]))


if __name__ == "__main__":
    main()
