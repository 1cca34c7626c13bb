#!/usr/bin/env python3
"""Multi-host benchmark on one machine: the controller and two nodes in network namespaces.

    tools/bench/multihost.py BUILD_DIR [--rounds 3] [--plugin-mb 100] [--checkpoint-mb 512]
                             [--launch agent|workers]

Uses tests/launchers/netns.py (the network) and test_multihost.Cluster (how the
controller and each node's workers start; --launch as TRAINRUN_TEST_NETNS_LAUNCH,
default agent). Needs root. Every number is the median of --rounds rounds.

(i) Time to first step: a 2-node, 4-worker FashionMNIST run (batch 32, log_every=1),
    launched as a cluster launcher would: controller and both nodes at once, each node
    with an empty plugin cache. The time runs from starting the controller until rank 0's
    "epoch 0 step 1/" line appears in the output files, which are polled every 20 ms (so
    each time is up to 20 ms late); the time until the controller has logged all 4
    workers connected is taken the same way. The run is then ended with SIGTERM.
(ii) Plugin distribution: libtest_plugin.so with --plugin-mb MB of random bytes appended
    (the loader maps only the segments the program headers name, so the trailing bytes
    travel and are hashed but never read), 8 workers, 4 per node, one cache per node (one
    worker of a node downloads, the others wait for it and load its copy). The time runs
    from starting the controller until the first report is recorded (the `steps` entry
    reports once; a report is a barrier, so every worker's train function had started),
    from result.jsonl's timestamp. Cold: empty caches; warm: the same run again with the
    caches the cold run filled. Distribution time = cold - warm.
(iii) Streamed checkpoint throughput across the veth: the test plugin's `big_checkpoint`
    entry, 2 workers on node1, one --checkpoint-mb MiB file each, the controller in ctrl
    writing the run's storage, with --checkpoint-upload stream (the namespaces share one
    filesystem, which auto would detect and copy into directly); its commit_s (report()
    until committed: streamed, hashed, fsynced, manifest, rename) gives MB/s. Baseline: a
    plain TCP copy of the same two files across the same veth, node1 -> ctrl, one
    connection per file: Python's socket.sendfile() to a receiver that writes to the same
    disk and fsyncs, no hashing. (cp would need a network filesystem.) The disk is synced
    and left quiet 2 s before each.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "launchers"))
import netns  # noqa: E402
from test_multihost import Cluster, TestFailure, check, finish, wait_for  # noqa: E402

COPY_PORT = 29500
BLOCK = 1 << 20

# The baseline's receiver: one thread per connection writes what arrives to its own
# file and fsyncs it; "ready" once it listens. Its exit is the end of the copy.
RECEIVER = r"""
import os, socket, sys, threading
address, count, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = socket.create_server((address, %d))
server.settimeout(60)
print("ready", flush=True)
def receive(conn, i):
    with conn, open(os.path.join(target, f"file{i}"), "wb") as f:
        while chunk := conn.recv(1 << 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
threads = [threading.Thread(target=receive, args=(server.accept()[0], i)) for i in range(count)]
for t in threads: t.start()
for t in threads: t.join()
""" % COPY_PORT

# The baseline's sender: one connection per file, each with sendfile in its own thread.
SENDER = r"""
import socket, sys, threading
address, paths = sys.argv[1], sys.argv[2:]
def send(path):
    with socket.create_connection((address, %d), timeout=60) as s, open(path, "rb") as f:
        s.sendfile(f)
threads = [threading.Thread(target=send, args=(p,)) for p in paths]
for t in threads: t.start()
for t in threads: t.join()
""" % COPY_PORT


def settle():
    """Earlier writes and deletions finish first, so each measurement starts on a quiet disk."""
    subprocess.run(["sync"], check=True, timeout=120)
    time.sleep(2)


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise TestFailure(f"timed out after {timeout} s waiting for {what}")


def first_step(cluster, plugin, key, round_index):
    """(i) Seconds from the controller's launch until all 4 connected and until step 1."""
    config = ["max_steps=1000", "epochs=1", "eval=false", "batch_size=32", "log_every=1"]
    launched = time.monotonic()
    controller = cluster.controller(f"first{round_index}", plugin, key, 4, config)
    nodes = [cluster.node(host, key, 2, cache=f"first{round_index}-cache-{host}")
             for host in ("node1", "node2")]
    wait_until(lambda: len(re.findall(r"a worker on node\d \(pid \d+\) connected",
                                      controller.text())) == 4, 60, "4 workers connected")
    connected = time.monotonic() - launched
    wait_for(r"epoch 0 step 1/", [controller, *nodes], 60)
    stepped = time.monotonic() - launched
    controller.popen.send_signal(signal.SIGTERM)
    controller.wait(30)
    for node in nodes:
        node.wait(20)
    return connected, stepped


def distribution(cluster, plugin, key, round_index):
    """(ii) Seconds from launch to all 8 workers started, cold then warm caches."""
    times = []
    for phase in ("cold", "warm"):
        name = f"dist{round_index}-{phase}"
        launched = time.time()
        controller = cluster.controller(name, plugin, key, 8, ["steps=1"],
                                        extra=["--entry", "steps"])
        nodes = [cluster.node(host, key, 4, cache=f"dist{round_index}-cache-{host}")
                 for host in ("node1", "node2")]
        finish(controller, nodes)
        with open(os.path.join(cluster.run_dir(name), "result.jsonl")) as f:
            times.append(json.loads(f.readline())["timestamp"] - launched)
    return times


def checkpoint_commit(cluster, plugin, key, source, round_index):
    """(iii) commit_s of 2 ranks on node1 streaming their files to the controller in ctrl."""
    name = f"ckpt{round_index}"
    settle()
    controller = cluster.controller(name, plugin, key, 2, [f"source={source}"],
                                    extra=["--entry", "big_checkpoint",
                                           "--checkpoint-upload", "stream"])
    nodes = [cluster.node("node1", key, 2)]
    finish(controller, nodes)
    with open(os.path.join(cluster.run_dir(name), "result.jsonl")) as f:
        seconds = json.loads(f.readlines()[-1])["metrics"]["commit_s"]
    shutil.rmtree(cluster.run_dir(name))
    return seconds


def tcp_copy(cluster, files, target):
    """(iii) baseline: seconds to send `files` from node1 to ctrl over TCP, written and fsynced."""
    os.makedirs(target)
    settle()
    net = cluster.net
    receiver = cluster.start(netns.CONTROLLER, "receiver",
                             [sys.executable, "-c", RECEIVER, net.ip(netns.CONTROLLER),
                              str(len(files)), target])
    wait_for(r"ready", [receiver], 30)
    start = time.monotonic()
    sender = cluster.start("node1", "sender", [sys.executable, "-c", SENDER,
                                               net.ip(netns.CONTROLLER), *files])
    check(receiver.wait(300) == 0, f"receiver failed:\n{receiver.text()}")
    seconds = time.monotonic() - start
    check(sender.wait(30) == 0, f"sender failed:\n{sender.text()}")
    copied = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))
    check(copied == sum(os.path.getsize(f) for f in files), "the TCP copy is incomplete")
    shutil.rmtree(target)
    return seconds


def write_random(path, mb):
    with open(path, "ab") as f:
        for _ in range(mb):
            f.write(os.urandom(BLOCK))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plugin-mb", type=int, default=100)
    parser.add_argument("--checkpoint-mb", type=int, default=512)
    parser.add_argument("--launch", choices=["agent", "workers"],
                        default=os.environ.get("TRAINRUN_TEST_NETNS_LAUNCH", "agent"))
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    fashion = os.path.join(build, "plugins", "fashion_mnist", "libfashion_mnist.so")
    test_plugin = os.path.join(build, "tests", "plugins", "libtest_plugin.so")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout
    print(f"load at start: {uptime.strip()}")
    print(f"{os.cpu_count()} cores, launch mode {args.launch}, {args.rounds} rounds", flush=True)

    workdir = tempfile.mkdtemp(prefix="trainrun-bench-multihost-")
    try:
        big_plugin = os.path.join(workdir, "libbig_plugin.so")
        shutil.copyfile(test_plugin, big_plugin)
        write_random(big_plugin, args.plugin_mb)
        source = os.path.join(workdir, "source")
        shards = []
        for rank in range(2):  # big_checkpoint's rank R reports source/rankR
            os.makedirs(os.path.join(source, f"rank{rank}"))
            shards.append(os.path.join(source, f"rank{rank}", f"shard-rank={rank}.bin"))
            write_random(shards[-1], args.checkpoint_mb)

        with netns.Network(["node1", "node2"]) as net:
            cluster = Cluster(net, build, workdir, args.launch)
            key = cluster.keygen("run.key")
            connects, steps, colds, warms, commits, copies = [], [], [], [], [], []
            for r in range(args.rounds):
                connected, stepped = first_step(cluster, fashion, key, r)
                connects.append(connected)
                steps.append(stepped)
                cold, warm = distribution(cluster, big_plugin, key, r)
                colds.append(cold)
                warms.append(warm)
                commits.append(checkpoint_commit(cluster, test_plugin, key, source, r))
                copies.append(tcp_copy(cluster, shards, os.path.join(workdir, f"copy{r}")))
                print(f"round {r}: connected {connected:.2f} s, first step {stepped:.2f} s; "
                      f"plugin cold {cold:.2f} s, warm {warm:.2f} s; checkpoint commit "
                      f"{commits[-1]:.2f} s, TCP copy {copies[-1]:.2f} s", flush=True)
    except netns.NetnsError as error:
        sys.exit(f"cannot set up the network: {error}")
    except TestFailure as error:
        sys.exit(f"failed: {error}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    median = statistics.median
    mb = 2 * args.checkpoint_mb * BLOCK / 1e6
    ours, baseline = mb / median(commits), mb / median(copies)
    rows = [
        ("(i) launch -> 4 workers connected", f"{median(connects):.2f} s"),
        ("(i) launch -> first training step", f"{median(steps):.2f} s"),
        (f"(ii) {args.plugin_mb} MB plugin, 8 workers started, cold cache",
         f"{median(colds):.2f} s"),
        ("(ii) same, warm cache", f"{median(warms):.2f} s"),
        ("(ii) distribution time (cold - warm)", f"{median(colds) - median(warms):.2f} s"),
        (f"(iii) streamed checkpoint, 2 x {args.checkpoint_mb} MiB, commit",
         f"{median(commits):.2f} s  {ours:7.1f} MB/s"),
        ("(iii) plain TCP copy (sendfile -> write+fsync)",
         f"{median(copies):.2f} s  {baseline:7.1f} MB/s"),
        ("(iii) ratio trainrun / TCP copy", f"{ours / baseline:.2f}"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"\nmedian of {args.rounds} rounds, {args.launch} launch:")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


if __name__ == "__main__":
    main()
