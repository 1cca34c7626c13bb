#!/usr/bin/env python3
"""Sharded data from local disk and from s3://, read as a rank reads it.

Writes synthetic shards sorted by label (build/tests/shards_bench write), then
in this invocation:
  local  shards_bench read on the local shards: the storage's own sequential
         read (cat, 128 KiB at a time) against the reader (one thread, rank 0's
         order) and the loader (prepare_data_loader's, 2 threads), in
         interleaved rounds; the time to the first batch at 0, 10, 50 and 90%
         of the epoch; the loader's memory; the label entropy of its batches
  s3     the same shards uploaded to SeaweedFS on loopback (tests/s3/s3tool.py)
         and read through s3://, alternating with local rounds
Prints the medians and the ratios: reader and loader / cat (target >= 0.9),
s3 / local (target >= 0.9), first batch (target <= 1 s), entropy (>= 0.95).

Run it with the Python that has boto3 (tools/setup_s3.sh):
  /opt/trainrun-s3/bin/python tools/bench/shards.py [--build build] [--samples 20000]
      [--bytes 50000] [--rounds 5] [--cold] [--no-s3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def read(bench, spec, rounds, cold):
    args = [bench, "read", spec, "--rounds", str(rounds)] + (["--cold"] if cold else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def values(lines, measure, key="mib_per_s"):
    return [line[key] for line in lines if line["measure"] == measure]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--bytes", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="drop the page cache (root)")
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args()
    bench = os.path.join(args.build, "tests", "shards_bench")
    tmp = tempfile.mkdtemp(prefix="trainrun-shards-bench-")
    server = None
    try:
        local = os.path.join(tmp, "shards")
        subprocess.run([bench, "write", local, "--samples", str(args.samples), "--bytes",
                        str(args.bytes)], check=True, capture_output=True)
        spec = os.path.join(local, "train-*.tar")
        remote_spec = None
        if not args.no_s3:
            from s3_transfer import start_server
            server, s3tool = start_server(tmp)
            client = s3tool.client()
            for name in sorted(os.listdir(local)):
                client.upload_file(os.path.join(local, name), "bench", "shards/" + name)
            count = len([n for n in os.listdir(local) if n.endswith(".tar")])
            remote_spec = "s3://bench/shards/train-{000000..%06d}.tar" % (count - 1)
        lines = {"local": [], "s3": []}
        for r in range(args.rounds):
            order = ["local", "s3"] if r % 2 == 0 else ["s3", "local"]
            for where in order:
                if where == "s3" and remote_spec is None:
                    continue
                lines[where] += read(bench, spec if where == "local" else remote_spec, 1,
                                     args.cold)
        med = statistics.median
        local_lines = lines["local"]
        cat = med(values(local_lines, "cat"))
        reader = med(values(local_lines, "reader"))
        loader = med(values(local_lines, "loader"))
        print(f"local ({args.samples} samples of {args.bytes} bytes, "
              f"{'cold' if args.cold else 'warm'} page cache, {args.rounds} rounds, medians):")
        print(f"  cat {cat:.0f} MiB/s, reader {reader:.0f} MiB/s ({reader / cat:.2f}), "
              f"loader {loader:.0f} MiB/s ({loader / cat:.2f})")
        firsts = [line for line in local_lines if line["measure"] == "first_batch"]
        for key in ("s_at_0", "s_at_10", "s_at_50", "s_at_90"):
            print(f"  first batch at {key[5:]}%: {med([f[key] for f in firsts]) * 1000:.1f} ms")
        memory = max(values(local_lines, "loader", "peak_rss_growth_mib"))
        print(f"  loader peak memory growth {memory:.1f} MiB (shuffle buffer "
              f"{local_lines[0].get('shuffle_buffer', 8192)} samples, read-ahead 128 MiB)")
        entropy = [line for line in local_lines if line["measure"] == "label_entropy"][0]
        print(f"  label entropy {entropy['bits']:.3f} bits against {entropy['uniform_bits']:.3f} "
              f"for a uniform permutation ({entropy['ratio']:.3f})")
        if remote_spec:
            s3_lines = lines["s3"]
            s3_reader = med(values(s3_lines, "reader"))
            s3_loader = med(values(s3_lines, "loader"))
            print("s3:// (SeaweedFS on loopback):")
            print(f"  reader {s3_reader:.0f} MiB/s ({s3_reader / reader:.2f} of local), "
                  f"loader {s3_loader:.0f} MiB/s ({s3_loader / loader:.2f} of local)")
            firsts = [line for line in s3_lines if line["measure"] == "first_batch"]
            for key in ("s_at_0", "s_at_50"):
                print(f"  first batch at {key[5:]}%: {med([f[key] for f in firsts]) * 1000:.1f} ms")
            print(f"  loader peak memory growth "
                  f"{max(values(s3_lines, 'loader', 'peak_rss_growth_mib')):.1f} MiB "
                  f"(chunk cache at most 256 MiB)")
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
