#!/usr/bin/env python3
"""The scale simulation: 64, 256 and 1024 scripted fake workers (no LibTorch)
go through rendezvous, plugin download and 1,000 metrics-only report barriers
against one controller. Prints, per size: the time until every rank is ready;
per report and rank, the round trip a rank sees in report() (REPORT sent to
REPORT_ACK received, which includes waiting for the last of N processes to be
scheduled and arrive) and the release (the last rank's REPORT sent to this
rank's REPORT_ACK received: the barrier's own cost), p50 and p99 of each; the
controller's CPU time and peak RSS; and its CPU time per rank-report, which
stays flat when the controller scales linearly.

    python3 tools/bench/scale.py [--build build] [--sizes 64 256 1024] [--reports 1000]

Each size is also run as a bare ZeroMQ barrier (tools/bench/zmq_barrier.cpp:
one ROUTER, N DEALER processes, no trainrun code), in the same invocation, and
the ratios trainrun / bare are printed: on a small machine, N processes taking
turns on the cores bound the round trip whatever the controller does.

Targets at 256 workers: ready in <= 2 s, report p50 <= 2 ms, controller RSS
<= 100 MB.
"""
import argparse
import json
import os
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--reports", type=int, default=1000)
    args = parser.parse_args()
    bench = os.path.join(args.build, "tests", "scale_bench")
    bare = os.path.join(args.build, "tests", "zmq_barrier")
    fake = os.path.join(args.build, "tests", "fake_worker")
    plugin = os.path.join(args.build, "tests", "plugins", "libtest_plugin.so")
    for path in (bench, bare, fake, plugin):
        if not os.path.exists(path):
            sys.exit(f"scale.py: {path} is missing: build the tests first")
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}; {os.cpu_count()} cores")
    print(f"{'workers':>7} {'ready s':>8} {'rtt p50 ms':>10} {'rtt p99 ms':>10} "
          f"{'release p50 ms':>14} {'release p99 ms':>14} {'ctl CPU s':>9} {'ctl RSS MB':>10} "
          f"{'CPU us/rank-report':>18}")
    failed = False
    ratios = []
    for size in args.sizes:
        proc = subprocess.run([bench, "--workers", str(size), "--reports", str(args.reports),
                               "--plugin", plugin, "--fake-worker", fake],
                              capture_output=True, text=True, timeout=1800)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if not lines:
            print(f"{size:>7} failed: {proc.stderr.strip()[-500:]}")
            failed = True
            continue
        r = json.loads(lines[-1])
        per = r["controller_cpu_s"] / (size * args.reports) * 1e6
        print(f"{size:>7} {r['ready_s']:8.2f} {r['round_trip_p50_us'] / 1000:10.2f} "
              f"{r['round_trip_p99_us'] / 1000:10.2f} {r['release_p50_us'] / 1000:14.2f} "
              f"{r['release_p99_us'] / 1000:14.2f} {r['controller_cpu_s']:9.2f} "
              f"{r['controller_peak_rss_mb']:10.1f} {per:18.2f}"
              + ("" if r["ok"] else f"  FAILED: {r['error']}"))
        failed |= not r["ok"]
        proc = subprocess.run([bare, "--clients", str(size), "--rounds", str(args.reports)],
                              capture_output=True, text=True, timeout=1800)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if not lines:
            print(f"{'bare':>7} failed: {proc.stderr.strip()[-500:]}")
            continue
        b = json.loads(lines[-1])
        print(f"{'bare':>7} {b['ready_s']:8.2f} {b['round_trip_p50_us'] / 1000:10.2f} "
              f"{b['round_trip_p99_us'] / 1000:10.2f} {b['release_p50_us'] / 1000:14.2f} "
              f"{b['release_p99_us'] / 1000:14.2f} {b['server_cpu_s']:9.2f}")
        ratios.append((size, r["ready_s"] / b["ready_s"],
                       r["round_trip_p50_us"] / b["round_trip_p50_us"],
                       r["release_p50_us"] / b["release_p50_us"],
                       r["controller_cpu_s"] / b["server_cpu_s"]))
    print("trainrun / bare ZeroMQ, same invocation:")
    for size, ready, rtt, release, cpu in ratios:
        print(f"{size:>7} workers: ready {ready:.2f}x (trainrun's adds the plugin download), "
              f"round trip p50 {rtt:.2f}x, release p50 {release:.2f}x, "
              f"CPU {cpu:.2f}x (trainrun's includes startup and shutdown)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
