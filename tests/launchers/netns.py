"""A small virtual network of Linux network namespaces, for multi-host tests on one machine.

    with netns.Network(["node1", "node2"]) as net:
        controller = net.popen("ctrl", ["trainrun", ...], stdout=...)
        endpoint = f"tcp://{net.ip('ctrl')}:29400"
        worker = net.popen("node1", ["trainrun", "worker", "--connect", endpoint])

Layout: one namespace per host, named `trn<pid>-<host>` so that parallel runs
never collide and a stale one can be traced back to its (dead) creator. The
bridge lives inside the "ctrl" namespace and each node is joined to it by a veth
pair created directly across namespaces, so nothing of the test network ever
appears in the root namespace: the subnet (10.213.<x>.0/24) is reachable only
from inside. Every command runs under its own UTS namespace with the host's
name set, because trainrun groups ranks by host name.

Teardown (context manager, atexit and SIGTERM) kills everything started in the
namespaces and deletes their links and the namespaces themselves. Needs root,
`ip` (iproute2) and `unshare` (util-linux).
"""
import atexit
import os
import re
import shlex
import signal
import subprocess
import sys
import time

PREFIX = "trn"
CONTROLLER = "ctrl"
BRIDGE = "br0"
COMMAND_TIMEOUT_S = 10  # bound for every `ip` call
KILL_WAIT_S = 5  # bound for processes to go after SIGKILL

_STALE_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class NetnsError(RuntimeError):
    """The network could not be set up (no root, no `ip netns`, no unshare)."""


def _ip(*args, check=True):
    """Runs `ip ARGS`; raises NetnsError with ip's message when check and it fails."""
    try:
        result = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetnsError(f"ip {' '.join(args)}: {error}") from error
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def list_namespaces():
    """The names of all network namespaces (`ip netns list` prints 'NAME (id: N)')."""
    result = _ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, and another user's
    return True


def _kill_namespace_processes(namespace):
    """SIGKILLs every process in `namespace`, until none is left or KILL_WAIT_S passed."""
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete_namespace(namespace):
    _kill_namespace_processes(namespace)
    _ip("netns", "delete", namespace, check=False)


def remove_stale():
    """Deletes namespaces of this project whose creating process no longer exists
    (a run killed with SIGKILL could not tear down). Returns the names removed."""
    removed = []
    for namespace in list_namespaces():
        match = _STALE_NAME.match(namespace)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(namespace)
            removed.append(namespace)
    return removed


class Network:
    """The namespaces "ctrl" and one per node, bridged on a private /24.

    Hosts are named by their short names ("ctrl", "node1"); `namespace(host)`
    gives the real namespace name, `ip(host)` its address."""

    def __init__(self, nodes=("node1", "node2"), controller_only=()):
        """`controller_only`: directories the nodes see empty (a tmpfs over each in
        their own mount namespace), as another host does not see the controller's disk."""
        self.tag = f"{PREFIX}{os.getpid()}-"
        self.hosts = [CONTROLLER, *nodes]
        self.controller_only = list(controller_only)
        # The subnet only exists inside these namespaces; varying it per run
        # keeps logs of concurrent runs apart.
        self.subnet = f"10.213.{os.getpid() % 250}"
        self._addresses = {host: f"{self.subnet}.{i + 1}" for i, host in enumerate(self.hosts)}
        self._processes = []
        self._created = []
        self._torn_down = False
        self._previous_sigterm = None

    def namespace(self, host):
        return self.tag + host

    def ip(self, host):
        return self._addresses[host]

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.teardown()

    def setup(self):
        """Creates the namespaces, bridge and veths; raises NetnsError if it cannot."""
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root")
        remove_stale()
        atexit.register(self.teardown)
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._build()
            # A veth-capable kernel is not enough: the UTS namespace for host names must work too.
            probe = self.run(CONTROLLER, ["hostname"], timeout=COMMAND_TIMEOUT_S)
            if probe.returncode != 0 or probe.stdout.strip() != CONTROLLER:
                raise NetnsError(f"unshare --uts in a namespace failed: {probe.stderr.strip()}")
        except BaseException:
            self.teardown()
            raise

    def _build(self):
        ctrl = self.namespace(CONTROLLER)
        for host in self.hosts:
            _ip("netns", "add", self.namespace(host))
            self._created.append(self.namespace(host))
            _ip("-n", self.namespace(host), "link", "set", "lo", "up")
        _ip("-n", ctrl, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", ctrl, "addr", "add", f"{self.ip(CONTROLLER)}/24", "dev", BRIDGE)
        _ip("-n", ctrl, "link", "set", BRIDGE, "up")
        for host in self.hosts[1:]:
            # The pair is born with one end in ctrl and the other in the node:
            # it never exists in the root namespace.
            port = f"v-{host}"[:15]
            _ip("-n", ctrl, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", self.namespace(host))
            _ip("-n", ctrl, "link", "set", port, "master", BRIDGE)
            _ip("-n", ctrl, "link", "set", port, "up")
            _ip("-n", self.namespace(host), "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _ip("-n", self.namespace(host), "link", "set", "eth0", "up")

    def command(self, host, argv):
        """argv wrapped to run in `host`'s namespace under its own host name, and on a
        node, in a mount namespace of its own without the controller's directories."""
        hide = [] if host == CONTROLLER else self.controller_only
        mounts = "".join(f"mount -t tmpfs trainrun-elsewhere {shlex.quote(d)} && " for d in hide)
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "--mount", "sh",
                "-c", f'hostname "$0" && {mounts}exec "$@"', host, *argv]

    def popen(self, host, argv, **kwargs):
        """Starts argv in `host` (its own session, so its process group can be killed); the
        process is tracked and killed at teardown. ip, unshare and sh all exec, so the
        Popen's pid is argv's own process."""
        process = subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)
        self._processes.append(process)
        return process

    def run(self, host, argv, timeout, **kwargs):
        """Runs argv in `host` to completion within `timeout` seconds (killed after it)."""
        process = self.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, **kwargs)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            stdout, stderr = process.communicate(timeout=KILL_WAIT_S)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def pids(self, host):
        """The pids of the processes now in `host`'s namespace."""
        out = _ip("netns", "pids", self.namespace(host), check=False).stdout
        return [int(pid) for pid in out.split()]

    def _on_sigterm(self, signum, frame):
        self.teardown()
        sys.exit(128 + signum)

    def teardown(self):
        """Kills what was started and deletes the links and namespaces; idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        for process in self._processes:
            kill_group(process)
        for namespace in self._created:
            _kill_namespace_processes(namespace)
        ctrl = self.namespace(CONTROLLER)
        if ctrl in self._created:
            for host in self.hosts[1:]:
                _ip("-n", ctrl, "link", "delete", f"v-{host}"[:15], check=False)
            _ip("-n", ctrl, "link", "delete", BRIDGE, check=False)
        for namespace in self._created:
            _ip("netns", "delete", namespace, check=False)
        atexit.unregister(self.teardown)
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        left = [name for name in list_namespaces() if name.startswith(self.tag)]
        if left:
            print(f"netns: could not delete {left}", file=sys.stderr)


def kill_group(process):
    """SIGKILLs a Popen's process group (it was started in its own session) and reaps it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
