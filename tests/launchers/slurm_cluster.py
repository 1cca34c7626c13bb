"""A throwaway single-node Slurm cluster for tests.

SlurmCluster starts its own munged, slurmctld and slurmd as root, with every
file (munge key and socket, slurm.conf, state, spool, pid files, logs) in a
fresh temporary directory and the daemons' ports chosen free on loopback, so it
neither reads nor disturbs a system-wide Slurm or munge, and stale pid files or
ports of an earlier run cannot get in its way. Clients (sbatch, srun, squeue...)
reach it through `cluster.env`, which sets SLURM_CONF.

    with SlurmCluster() as cluster:
        subprocess.run(["sbatch", "--wait", "job.sh"], env=cluster.env)

Teardown cancels the jobs, stops the daemons, ends whatever of the jobs is left
and removes the directory; it runs on leaving the `with` block, at interpreter
exit and on SIGTERM/SIGHUP. A test killed outright (SIGKILL) takes the daemons
with it (the kernel signals them when their parent dies), but not its jobs'
processes: slurmstepd detaches from slurmd. The next cluster to start ends
those, and removes their directory (a cluster that still has a daemon is
someone's live cluster, and left alone).

A test may keep its own files under `cluster.root`: they go with the cluster's.

Every process of a cluster, the jobs' included, carries SLURM_CONF naming the
cluster's slurm.conf in its environment (the daemons get it from here, the jobs
from sbatch), which is how teardown finds them.
"""

import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 15
DIR_PREFIX = "trainrun-slurm-"
DAEMONS = {"munged", "slurmctld", "slurmd"}

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn: the kernel sends SIGTERM to the daemon when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _ephemeral_ports():
    """The kernel's range for outgoing connections' local ports (low, high)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_loopback_port():
    """A TCP port nothing listens on now, on 127.0.0.1, below the ephemeral range.

    The kernel's own pick (bind to port 0) comes from the range it also gives
    outgoing connections, so one of those (a Gloo ring, a Slurm RPC) can take it
    between this check and the real bind; a port below the range cannot be taken
    that way."""
    low, _ = _ephemeral_ports()
    first = max(1024, low - 12000)
    candidates = list(range(first, low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in [{first}, {low})")


def _wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout_s} s")


def _processes_by_conf():
    """{slurm.conf path: [(pid, argv[0])]} for the processes of this module's clusters."""
    owned = os.path.join(tempfile.gettempdir(), DIR_PREFIX)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv0 = cmdline.read().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        for variable in variables:
            if variable.startswith(b"SLURM_CONF="):
                conf = variable.removeprefix(b"SLURM_CONF=").decode(errors="replace")
                if conf.startswith(owned):
                    found.setdefault(conf, []).append((int(entry), argv0))
    return found


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def end_abandoned_clusters():
    """Ends the jobs' processes of clusters whose daemons are all gone, removes their files."""
    for conf, processes in _processes_by_conf().items():
        if not any(os.path.basename(argv0) in DAEMONS for _, argv0 in processes):
            _kill(pid for pid, _ in processes)
            shutil.rmtree(os.path.dirname(conf), ignore_errors=True)


class SlurmCluster:
    """munged + slurmctld + one slurmd: this host as the only node, `cpus` CPUs."""

    def __init__(self, cpus=None):
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.node = socket.gethostname().split(".")[0]
        self.root = None
        self.conf = None
        self.env = None
        self._daemons = []  # (name, Popen), in start order
        self._previous_signal_handlers = {}

    # --- lifecycle -------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        end_abandoned_clusters()
        self.root = tempfile.mkdtemp(prefix=DIR_PREFIX)
        # munged requires every directory above its socket to be searchable by all.
        os.chmod(self.root, 0o755)
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = self._client_env(self.conf)
        atexit.register(self.stop)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous_signal_handlers[signum] = signal.signal(signum, self._on_signal)
        try:
            self._start_munged()
            self._write_slurm_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
            self._spawn("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", self.node])
            _wait_until(self._node_idle, START_TIMEOUT_S, f"node {self.node} not idle")
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Idempotent: cancels jobs, stops the daemons, ends leftovers, removes the files."""
        if self.root is None:
            return
        if self._running("slurmctld"):
            try:
                self.cancel_jobs()
                # slurmd ends the jobs' processes; give it the time to.
                _wait_until(lambda: not self.squeue(), STOP_TIMEOUT_S, "jobs still queued")
            except (TimeoutError, subprocess.SubprocessError):
                pass
        for _, process in reversed(self._daemons):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self._daemons):
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._daemons.clear()
        # A job that did not end in time, or a step slurmd lost track of.
        _kill(pid for pid, _ in _processes_by_conf().get(self.conf, []))
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        atexit.unregister(self.stop)
        for signum, handler in self._previous_signal_handlers.items():
            signal.signal(signum, handler)
        self._previous_signal_handlers.clear()

    def _on_signal(self, signum, _frame):
        # Unwinds through `with` blocks and finally clauses, which call stop().
        sys.exit(128 + signum)

    # --- jobs and diagnostics ------------------------------------------------

    def cancel_jobs(self):
        """Cancels every job in this cluster (they are all root's)."""
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=STOP_TIMEOUT_S, check=False)

    def squeue(self):
        """The ids of the jobs in the queue."""
        out = subprocess.run(["squeue", "--noheader", "--format=%i"], env=self.env,
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.split()

    def log_tail(self, lines=20):
        """The last lines of each daemon's log, for a failure message."""
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            path = os.path.join(self.root, "log", f"{name}.log")
            try:
                with open(path, errors="replace") as log:
                    tail = log.readlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {path}\n" + "".join(tail))
        return "\n".join(parts)

    def _running(self, name):
        return any(n == name and p.poll() is None for n, p in self._daemons)

    def _node_idle(self):
        for name, process in self._daemons:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}\n{self.log_tail()}")
        result = subprocess.run(["sinfo", "--noheader", "--nodes", self.node, "--format=%T"],
                                env=self.env, capture_output=True, text=True, timeout=10,
                                check=False)
        return result.stdout.strip() == "idle"

    # --- setup ----------------------------------------------------------------

    def _path(self, *parts, mode=None):
        path = os.path.join(self.root, *parts)
        if mode is not None:
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)  # makedirs' mode is filtered by the umask
        return path

    def _spawn(self, name, argv):
        with open(os.path.join(self._path("log", mode=0o755), f"{name}.out"), "wb") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=self.env,
                                       preexec_fn=_die_with_parent)
        self._daemons.append((name, process))

    def _start_munged(self):
        key_dir = self._path("munge", mode=0o700)
        self.munge_socket = os.path.join(self._path("run", mode=0o755), "munge.socket")
        key = os.path.join(key_dir, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(os.urandom(128))
        self._spawn("munged", [
            "munged", "--foreground", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={os.path.join(key_dir, 'munged.pid')}",
            f"--seed-file={os.path.join(key_dir, 'munged.seed')}",
            f"--log-file={os.path.join(self._path('log', mode=0o755), 'munged.log')}",
        ])
        _wait_until(lambda: os.path.exists(self.munge_socket), START_TIMEOUT_S,
                    "munged did not create its socket")

    def _write_slurm_conf(self):
        state = self._path("state", mode=0o700)
        spool = self._path("spool", mode=0o755)
        run = self._path("run", mode=0o755)
        log = self._path("log", mode=0o755)
        plugstack = self._path("plugstack.conf")
        open(plugstack, "w").close()  # no SPANK plugins, whatever /etc/slurm has
        with open(self.conf, "w") as out:
            out.write(f"""\
ClusterName=trainrun-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmctldPort={free_loopback_port()}
SlurmdPort={free_loopback_port()}
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdLogFile={log}/slurmd.log
PlugStackConfig={plugstack}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
# The node as configured here, even if this host has fewer cores.
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    @staticmethod
    def _client_env(conf):
        # A test started inside a Slurm job must not hand that job's settings to sbatch.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = conf
        return env
