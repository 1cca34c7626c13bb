#!/usr/bin/env python3
"""Multi-host runs on one machine: the controller and two nodes in network namespaces.

    tests/launchers/test_multihost.py BUILD_DIR

BUILD_DIR holds trainrun, trainrun-worker and plugins/fashion_mnist/libfashion_mnist.so
(and tests/plugins/libtest_plugin.so for the rank-grouping check, skipped without it).
The controller runs in namespace "ctrl" with --listen on the private test subnet; each node
("node1", "node2") has its own host name and plugin cache, so it fetches the plugin and
streams its checkpoints through the controller like a real host.

TRAINRUN_TEST_NETNS_LAUNCH picks how a node starts its 2 workers:
  agent    (default) one `trainrun worker --nproc 2` per node, the node's agent
  workers  two `trainrun worker` processes under one `sh` per node (that sh is the "agent")

Scenarios: (a) keygen, a run across both nodes with a checkpoint, ranks grouped by host,
and a rerun that resumes; (b) a peer with another key is refused while the run finishes;
(c) kill -9 of node2's agent fails the run within the heartbeat timeout, naming node2;
(d) with --num-workers 2:4 --max-failures 1 (agent mode), kill -9 of node2's agent restarts
the run on node1's 2 workers, which resume from the streamed checkpoint and finish.

Exit codes: 0 passed, 1 failed, 77 skipped (not root, or no `ip netns`/unshare).
"""
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

PORT = 29400
HEARTBEAT_S = 5
FAILURE_SLACK_S = 20  # beyond the heartbeat timeout: the controller's poll, stopping the others (a hang would be Gloo's 30 minutes)
WHOLE_TEST_S = 220  # a watchdog well inside ctest's budget
RUN_TIMEOUT_S = 90  # any one trainrun run
POLL_S = 0.02
TINY = ["max_steps=5", "epochs=1", "eval_steps=1", "batch_size=32", "log_every=1"]
STEP_LINE = r"epoch \d+ step \d+/"  # rank 0 prints one per step with log_every=1


class TestFailure(Exception):
    pass


class Process:
    """A process on the test network with its output in a file."""

    def __init__(self, popen, output, host):
        self.popen, self.output, self.host = popen, output, host

    def text(self):
        with open(self.output, errors="replace") as f:
            return f.read()

    def wait(self, timeout):
        """The exit code, or TestFailure when it is still running after `timeout` s."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{self.output} still running after {timeout} s:\n"
                              + tail(self.text())) from None


class Cluster:
    """trainrun on a netns.Network: the controller in ctrl, workers on the nodes.
    tools/bench/multihost.py uses it too."""

    def __init__(self, net, build, workdir, mode):
        self.net, self.workdir, self.mode = net, workdir, mode
        self.trainrun = os.path.join(build, "trainrun")
        self.endpoint = f"tcp://{net.ip(netns.CONTROLLER)}:{PORT}"
        self.storage = os.path.join(workdir, "results")
        # One thread per worker: 4 workers share 2 cores.
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self._count = 0

    def start(self, host, label, argv):
        self._count += 1
        output = os.path.join(self.workdir, f"{self._count:02d}-{label}.out")
        with open(output, "wb") as f:
            popen = self.net.popen(host, argv, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                   cwd=self.workdir)
        return Process(popen, output, host)

    def keygen(self, name):
        path = os.path.join(self.workdir, name)
        result = subprocess.run([self.trainrun, "keygen", path], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=30)
        check(result.returncode == 0, f"trainrun keygen failed: {result.stdout}")
        check(os.stat(path).st_mode & 0o777 == 0o600, "the run key is not mode 0600")
        return path

    def controller(self, name, plugin, key, num_workers, config, extra=()):
        argv = [self.trainrun, "--plugin", plugin, "--num-workers", str(num_workers),
                "--listen", self.endpoint, "--auth-key", key, "--storage-path", self.storage,
                "--name", name, "--heartbeat-timeout", str(HEARTBEAT_S), "--startup-timeout", "60",
                "--cpus-per-worker", "1", *extra, "--config", *config]
        return self.start(netns.CONTROLLER, f"controller-{name}", argv)

    def worker_argv(self, key, cache):
        return [self.trainrun, "worker", "--connect", self.endpoint, "--auth-key", key,
                "--cache-dir", os.path.join(self.workdir, cache)]

    def node(self, host, key, nproc, cache=None, stagger_s=0.0):
        """Starts `nproc` workers on `host`: its agent, or one sh over plain workers
        (started `stagger_s` apart). The cache is the node's own unless named."""
        argv = self.worker_argv(key, cache or f"cache-{host}")
        if self.mode == "agent":
            return self.start(host, f"agent-{host}", [*argv, "--nproc", str(nproc)])
        script = (f'i=0; while [ $i -lt {nproc} ]; do "$@" & i=$((i+1)); sleep {stagger_s}; done;'
                  ' wait')
        return self.start(host, f"workers-{host}", ["sh", "-c", script, "sh", *argv])

    def kill_agent(self, agent):
        """kill -9 of a node's agent; in workers mode also of the workers under its sh,
        which would otherwise outlive it (they share its process group)."""
        if self.mode == "agent":
            os.kill(agent.popen.pid, signal.SIGKILL)
        else:
            os.killpg(agent.popen.pid, signal.SIGKILL)

    def run_dir(self, name):
        return os.path.join(self.storage, name)

    def wait_listening(self, controller, timeout=30):
        wait_for(r"remote workers connect to tcp://", [controller], timeout)


def check(condition, message):
    if not condition:
        raise TestFailure(message)


def tail(text, lines=15):
    return "\n".join(text.splitlines()[-lines:])


def wait_for(pattern, processes, timeout):
    """The first match of `pattern` in the processes' output, within `timeout` s."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            match = regex.search(process.text())
            if match:
                return match
        if all(p.popen.poll() is not None for p in processes):
            break
        time.sleep(POLL_S)
    raise TestFailure(f"no /{pattern}/ within {timeout} s in:\n"
                      + "\n".join(f"--- {p.output}\n{tail(p.text())}" for p in processes))


def finish(controller, nodes):
    """Waits for the controller and the nodes; checks that the run finished."""
    code = controller.wait(RUN_TIMEOUT_S)
    for node in nodes:
        node.wait(HEARTBEAT_S + 10)  # the controller told them to stop
    check(code == 0, f"the run failed ({code}):\n{tail(controller.text(), 30)}")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def start_run(cluster, name, plugin, key, config, stagger_s=0.0, extra=()):
    """A 4-worker run: the controller, then node1 and node2 with 2 workers each."""
    controller = cluster.controller(name, plugin, key, 4, config, extra)
    cluster.wait_listening(controller)
    nodes = [cluster.node("node1", key, 2, stagger_s=stagger_s)]
    time.sleep(stagger_s / 2)  # in workers mode HELLOs then alternate between the nodes
    nodes.append(cluster.node("node2", key, 2, stagger_s=stagger_s))
    return controller, nodes


def scenario_run_and_resume(cluster, fashion, key):
    """(a) A run across both nodes checkpoints through the controller; a rerun resumes."""
    # The nodes do not see the storage (netns.Network's controller_only): --checkpoint-upload
    # auto finds that out and streams their checkpoints through the controller.
    controller, nodes = start_run(cluster, "mnist", fashion, key, TINY)
    finish(controller, nodes)
    out = controller.text()
    check("shares the run directory's filesystem" not in out,
          f"a worker copied its checkpoint instead of streaming it:\n{tail(out, 30)}")
    for host in ("node1", "node2"):
        connected = re.findall(rf"a worker on {host} \(pid \d+\) connected", out)
        check(len(connected) == 2, f"expected 2 workers on {host}, the controller says:\n{out}")
    # Where the ranks run, a line per node: each node has 2 consecutive ranks.
    placement = re.findall(r"node (\d+) \((\S+)\): ranks (\d+)-(\d+)", out)
    check(sorted(host for _, host, _, _ in placement) == ["node1", "node2"] and
          all(int(first) == 2 * int(node) and int(last) == int(first) + 1
              for node, _, first, last in placement),
          f"the controller's rank placement: {placement}\n{tail(out, 30)}")
    if cluster.mode == "agent":
        # The agent forwards its workers' output to the controller, rank-prefixed.
        check(re.search(r"\[rank 0 \(node[12], pid \d+\)\] FashionMNIST", out),
              f"no forwarded rank-0 line on the controller:\n{tail(out, 30)}")
    run_dir = cluster.run_dir("mnist")
    results = read_jsonl(os.path.join(run_dir, "result.jsonl"))
    check(len(results) == 1 and results[0]["checkpoint"] == "checkpoint_000000",
          f"result.jsonl: {results}")
    with open(os.path.join(run_dir, "checkpoint_state.json")) as f:
        state = f.read()
    check("checkpoint_000000" in state, f"checkpoint_state.json: {state}")
    for name in ("manifest.json", "model.pt", "optimizer.pt", "epoch.txt"):
        check(os.path.isfile(os.path.join(run_dir, "checkpoint_000000", name)),
              f"checkpoint_000000/{name} missing")

    config = [c for c in TINY if not c.startswith("epochs=")] + ["epochs=2"]
    controller, nodes = start_run(cluster, "mnist", fashion, key, config)
    finish(controller, nodes)
    resumed = wait_for(r"resuming after epoch 0 from (\S+)", [controller, *nodes], 1)
    # Rank 0 reads a copy fetched through the controller, not the storage itself.
    check(not resumed.group(1).startswith(cluster.storage),
          f"rank 0 resumed from the storage directly: {resumed.group(0)}")
    results = read_jsonl(os.path.join(run_dir, "result.jsonl"))
    check(len(results) == 2 and results[1]["metrics"]["epoch"] == 1,
          f"the rerun did not continue at epoch 1: {results}")
    return resumed.group(0)


def scenario_grouping(cluster, test_plugin, key):
    """(a) Ranks are grouped by host even when the nodes' workers connect interleaved."""
    controller, nodes = start_run(cluster, "context", test_plugin, key,
                                  ["reports=1"], stagger_s=1.0, extra=["--entry", "context"])
    finish(controller, nodes)
    order = re.findall(r"a worker on (node\d) \(pid", controller.text())
    ranks = {}
    line = re.compile(r"(?:\[rank \d+ \((\S+), pid \d+\)\] )?context world_rank=(\d+) "
                      r"local_rank=(\d+) node_rank=(\d+) world_size=4 local_world_size=(\d+)")
    for process in [controller, *nodes]:
        for prefix_host, world, local, node, local_size in line.findall(process.text()):
            # A forwarded line names its host; a worker's own output is its node's.
            ranks[int(world)] = (prefix_host or process.host, int(local), int(node),
                                 int(local_size))
    check(sorted(ranks) == [0, 1, 2, 3], f"context lines for ranks {sorted(ranks)}")
    node_ranks = {}  # host -> the node ranks its workers were given
    for world, (host, local, node, local_size) in ranks.items():
        check(local_size == 2 and local in (0, 1) and world == node * 2 + local,
              f"rank {world} on {host}: local_rank {local}, node_rank {node}, "
              f"local_world_size {local_size}")
        node_ranks.setdefault(host, set()).add(node)
    check(sorted(node_ranks) == ["node1", "node2"] and
          all(len(nodes) == 1 for nodes in node_ranks.values()) and
          node_ranks["node1"] != node_ranks["node2"], f"ranks not grouped by host: {ranks}")
    return f"connected in order {order}; rank -> (host, local, node): " + ", ".join(
        f"{w}->({h},{l},{n})" for w, (h, l, n, _) in sorted(ranks.items()))


def scenario_wrong_key(cluster, fashion, key):
    """(b) A peer with another run's key is refused; the run with the right workers finishes."""
    other = cluster.keygen("other.key")
    controller = cluster.controller("wrongkey", fashion, key, 4, TINY)
    cluster.wait_listening(controller)
    stranger = cluster.start("node2", "stranger", [*cluster.worker_argv(other, "cache-stranger"),
                                                   "--startup-timeout", "10"])
    wait_for(r"refused a peer", [controller], 20)
    nodes = [cluster.node("node1", key, 2), cluster.node("node2", key, 2)]
    finish(controller, nodes)
    code = stranger.wait(25)
    check(code != 0, f"the stranger exited 0:\n{stranger.text()}")
    # It never said HELLO (4 workers connected, all of the right nodes) nor fetched the plugin.
    connected = re.findall(r"a worker on \S+ \(pid (\d+)\) connected", controller.text())
    check(len(connected) == 4, f"{len(connected)} workers connected:\n{controller.text()}")
    cached = [f for _, _, files in os.walk(os.path.join(cluster.workdir, "cache-stranger"))
              for f in files]
    check(not cached, f"the stranger fetched the plugin: {cached}")
    with open(os.path.join(cluster.run_dir("wrongkey"), "logs", "controller.log")) as f:
        refused = [line for line in f if "refused a peer" in line]
    # Rate-limited, not counted: a stranger that keeps retrying may be refused in
    # a line per 10 s for as long as it tries (longer on a loaded machine).
    check(refused, "no 'refused a peer' line")
    stamps = [datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f") for line in refused]
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    check(all(gap >= 9.9 for gap in gaps), f"'refused a peer' more than once per 10 s: {refused}")
    return f"stranger exit {code}: {tail(stranger.text(), 1)!r}; controller: {refused[0].strip()!r}"


def scenario_lost_node(cluster, fashion, key):
    """(c) kill -9 of node2's agent fails the run within the heartbeat timeout, naming node2."""
    config = ["max_steps=100000", "epochs=1", "eval=false", "batch_size=32", "log_every=1"]
    controller, nodes = start_run(cluster, "lost", fashion, key, config)
    wait_for(STEP_LINE, [controller, *nodes], 60)
    killed_at = time.monotonic()
    cluster.kill_agent(nodes[1])
    code = controller.wait(HEARTBEAT_S + FAILURE_SLACK_S + 30)
    took = time.monotonic() - killed_at
    error_path = os.path.join(cluster.run_dir("lost"), "error.json")
    error = {}
    if os.path.exists(error_path):
        with open(error_path) as f:
            error = json.load(f)
    nodes[0].wait(HEARTBEAT_S + 10)
    deadline = time.monotonic() + HEARTBEAT_S + 5
    while cluster.net.pids("node2") and time.monotonic() < deadline:
        time.sleep(0.1)  # the agent's workers go when they notice it is gone
    # Every expectation is checked, so that one failure does not hide the others.
    problems = []
    if code == 0:
        problems.append("the run did not fail")
    if error.get("host") != "node2" or error.get("kind") != "lost":
        problems.append("error.json does not name node2's lost worker")
    if cluster.mode == "agent" and "nor did the node agent on node2" not in error.get("message", ""):
        problems.append("error.json does not say node2's agent is silent too")
    failed = re.search(r"run failed: .*", controller.text())
    if not failed or "node2" not in failed.group(0):
        problems.append("the controller's failure line does not name node2")
    if took > HEARTBEAT_S + FAILURE_SLACK_S:
        problems.append(f"the run failed {took:.1f} s after the kill "
                        f"(limit {HEARTBEAT_S + FAILURE_SLACK_S} s)")
    if cluster.net.pids("node2"):
        problems.append(f"processes left on node2: {cluster.net.pids('node2')}")
    summary = f"exit {code} {took:.1f} s after the kill; error.json: {json.dumps(error)}"
    check(not problems, "; ".join(problems) + f"\n{summary}\n{tail(controller.text(), 8)}")
    return summary


def scenario_restart_on_survivors(cluster, test_plugin, key):
    """(d) node2's agent killed: the elastic run goes on with node1's workers."""
    controller = cluster.controller(
        "elastic", test_plugin, key, "2:4", ["steps=200", "sleep_ms=20"],
        ["--entry", "resumable", "--max-failures", "1"])
    cluster.wait_listening(controller)
    nodes = [cluster.node("node1", key, 2), cluster.node("node2", key, 2)]
    wait_for(r"report 5 ", [controller], 60)
    killed_at = time.monotonic()
    cluster.kill_agent(nodes[1])
    wait_for(r"attempt 2 goes on with 2 of 4 workers", [controller], HEARTBEAT_S + 30)
    took = time.monotonic() - killed_at
    code = controller.wait(RUN_TIMEOUT_S)
    nodes[0].wait(HEARTBEAT_S + 10)
    deadline = time.monotonic() + HEARTBEAT_S + 5
    while cluster.net.pids("node2") and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(os.path.join(cluster.run_dir("elastic"), "run.json")) as f:
        attempts = json.load(f)["attempts"]
    results = read_jsonl(os.path.join(cluster.run_dir("elastic"), "result.jsonl"))
    problems = []
    if code != 0:
        problems.append(f"the run did not finish ({code})")
    if [a["world_size"] for a in attempts] != [4, 2]:
        problems.append(f"attempts: {attempts}")
    elif attempts[0].get("error", {}).get("host") != "node2":
        problems.append(f"attempt 1 did not end naming node2: {attempts[0]}")
    if not results or results[-1]["metrics"]["step"] != 199 or results[-1]["attempt"] != 2:
        problems.append(f"the last report: {results[-1] if results else None}")
    second = [r for r in results if r["attempt"] == 2]
    if not second or second[0]["metrics"]["resumed_at"] == 0 or second[0]["metrics"]["sum"] != 2:
        problems.append(f"attempt 2 did not resume on 2 workers: {second[:1]}")
    if cluster.net.pids("node2"):
        problems.append(f"processes left on node2: {cluster.net.pids('node2')}")
    summary = (f"attempt 2 on node1 {took:.1f} s after the kill, resumed at step "
               f"{second[0]['metrics']['resumed_at'] if second else '?'}")
    check(not problems, "; ".join(problems) + f"\n{summary}\n{tail(controller.text(), 12)}")
    return summary


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    mode = os.environ.get("TRAINRUN_TEST_NETNS_LAUNCH", "agent")
    if mode not in ("agent", "workers"):
        sys.exit(f"TRAINRUN_TEST_NETNS_LAUNCH must be agent or workers, not {mode!r}")
    fashion = os.path.join(build, "plugins", "fashion_mnist", "libfashion_mnist.so")
    test_plugin = os.path.join(build, "tests", "plugins", "libtest_plugin.so")
    for path in (os.path.join(build, "trainrun"), os.path.join(build, "trainrun-worker"), fashion):
        if not os.path.exists(path):
            sys.exit(f"missing {path}")

    def watchdog(signum, frame):
        raise TestFailure(f"the test ran past {WHOLE_TEST_S} s")

    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(WHOLE_TEST_S)
    workdir = tempfile.mkdtemp(prefix="trainrun-multihost-")
    started = time.monotonic()
    try:
        storage = os.path.join(workdir, "results")  # the controller's disk alone
        os.makedirs(storage)
        with netns.Network(["node1", "node2"], controller_only=[storage]) as net:
            cluster = Cluster(net, build, workdir, mode)
            key = cluster.keygen("run.key")
            scenarios = [("a: run, checkpoint, resume", scenario_run_and_resume, fashion)]
            if os.path.exists(test_plugin):
                scenarios.append(("a: ranks grouped by host", scenario_grouping, test_plugin))
            else:
                print(f"note: no {test_plugin}, the rank-grouping check is skipped")
            scenarios += [("b: a peer with another key", scenario_wrong_key, fashion),
                          ("c: node2's agent killed", scenario_lost_node, fashion)]
            if mode == "agent" and os.path.exists(test_plugin):
                scenarios.append(("d: node2's agent killed, the run goes on on node1",
                                  scenario_restart_on_survivors, test_plugin))
            for title, scenario, plugin in scenarios:
                begin = time.monotonic()
                detail = scenario(cluster, plugin, key)
                print(f"ok   {title} ({time.monotonic() - begin:.1f} s): {detail}", flush=True)
    except netns.NetnsError as error:
        print(f"skipped: {error}")
        shutil.rmtree(workdir, ignore_errors=True)
        return 77
    except TestFailure as error:
        print(f"FAIL ({mode} mode): {error}\n(outputs kept in {workdir})")
        return 1
    finally:
        signal.alarm(0)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"passed in {time.monotonic() - started:.1f} s ({mode} mode)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
