#!/usr/bin/env python3
"""Hyperparameter search: trainrun tune's FIFO, ASHA and PBT against Ray Tune's FIFO and ASHA.

The same search on FashionMNIST ResNet-18 (plugins/fashion_mnist: Adam, the
trial's lr and batch_size, --batches batches in each of --epochs epochs, then
--eval-batches test batches of batch_size, a report with the test accuracy and a
checkpoint): --trials trials drawn from lr loguniform(1e-4, 1e-1) and
batch_size choice(32, 64, 128) with --seed, each trial 1 worker of 1 CPU,
--max-concurrent-trials (2) at once, on this host. Each round runs, in turn:
  trainrun FIFO    build/trainrun tune --scheduler fifo (every trial to the end);
  trainrun ASHA    --scheduler asha --time-attr training_iteration --max-t EPOCHS
                   --grace-period 1 --reduction-factor 2;
  trainrun PBT     --scheduler pbt --perturbation-interval 1 --quantile-fraction
                   0.25 --resample-probability 0.25;
  Ray Tune FIFO    tools/bench/tune_ray.py: ray.tune.Tuner(TorchTrainer(...),
                   param_space={"train_loop_config": ...}, TuneConfig(metric=
                   "accuracy", mode="max", scheduler, max_concurrent_trials)),
                   the recipe in PyTorch, on a local Ray cluster (127.0.0.1);
  Ray Tune ASHA    ASHAScheduler(time_attr="training_iteration", max_t=EPOCHS,
                   grace_period=1, reduction_factor=2);
  start overhead   --start-trials trivial trials one at a time (1 worker, max
                   concurrent 1): trainrun tune of build/tests/plugins/
                   libtest_plugin.so --entry steps --config steps=1 (one report,
                   then return), and a Ray Tune TorchTrainer whose train_func calls
                   ray.train.report({"accuracy": 0}) once; overhead = wall / K.
Ray's trials run the very configs that the round's trainrun FIFO drew (read
from its experiment.json; a tune.grid_search over them), so that both systems
search the same points (--ray-sampling own: Ray draws its own with
BasicVariantGenerator(random_state=--seed)).

For each it prints the best accuracy, the wall time and CPU-seconds from the
launch to the first report of it, the same to FIFO's best less --tolerance,
the total wall and CPU, the trials run to the end and stopped early, and the
epochs trained. A report's time is when the controller recorded it
(result.jsonl's timestamp; for Ray, when the driver's tune.Callback received
the result). CPU-seconds are the process tree's: getrusage(RUSAGE_CHILDREN)
around the run, with this process made the tree's child subreaper so that
every descendant is waited for; the CPU at a report's time comes from sampling
/proc (the live tree's utime+stime+cutime+cstime plus what was reaped) every
--sample-s. Then the goals, each the median of the rounds' ratios:
  trainrun ASHA's time to FIFO's best - tol / trainrun FIFO's time to its best  (<= 1/3)
  trainrun ASHA's time to Ray ASHA's best - tol / Ray ASHA's time to its best  (<= 0.5)
  per-trial start overhead, trainrun / Ray Tune                                (<= 0.1)

Ray Tune runs in a virtual environment that sees Debian's PyTorch 1.13 (numpy
1.x for it, the newest pyarrow that runs with numpy 1.x, a pandas for numpy 1.x):

  /usr/bin/python3 -m venv --system-site-packages /opt/trainrun-ray &&
    /opt/trainrun-ray/bin/pip install 'ray[train,tune]==2.60.0' 'numpy==1.26.4' \\
      'pyarrow==25.0.1' 'pandas==2.2.3'

  tools/bench/tune.py [--build build] [--rounds 1] [--trials 8] [--epochs 4] [--batches 50]
      [--eval-batches 20] [--start-trials 10] [--tolerance 0.005] [--skip-ray]
      [--storage DIR] [--keep]
"""
import argparse
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RAY_VENV = "/opt/trainrun-ray"
INSTALL = (f"Ray Tune is missing (or --skip-ray): /usr/bin/python3 -m venv --system-site-packages "
           f"{RAY_VENV} && {RAY_VENV}/bin/pip install 'ray[train,tune]==2.60.0' "
           "'numpy==1.26.4' 'pyarrow==25.0.1' 'pandas==2.2.3'")
# The search space, as tune_ray.py --space takes it; trainrun's --param forms from it.
SPACE = {"lr": ["loguniform", 1e-4, 1e-1], "batch_size": ["choice", [32, 64, 128]]}
TRAINRUN = ["trainrun FIFO", "trainrun ASHA", "trainrun PBT"]
RAY = ["Ray Tune FIFO", "Ray Tune ASHA"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


def trainrun_param(key, spec):
    """SPACE's `spec` of `key` as trainrun tune's --param value."""
    kind = spec[0]
    if kind in ("choice", "grid"):
        return f"{key}={kind}:{','.join(str(v) for v in spec[1])}"
    return f"{key}={kind}:{spec[1]:g}:{spec[2]:g}"


# --- the process tree's CPU time ---------------------------------------------------------

def proc_table():
    """{pid: (ppid, state, utime+stime+cutime+cstime in seconds, starttime)} of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields from the state on (proc(5)'s 3rd): utime, stime, cutime and cstime are
        # its 14th-17th, starttime its 22nd.
        table[int(name)] = (int(fields[1]), fields[0],
                            sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK,
                            int(fields[19]))
    return table


def descendants(table, root):
    """The pids under `root` in `table`."""
    children = {}
    for pid, row in table.items():
        children.setdefault(row[0], []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ignores_sigchld(pid):
    """Whether `pid` ignores SIGCHLD: its children are reaped without a trace in its cutime."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGCHLD - 1)))
    except OSError:
        pass
    return False


class TreeCpu:
    """The CPU-seconds of the tree under this process (a child subreaper) since its creation.

    getrusage(RUSAGE_CHILDREN) counts what this process waited for, with what
    each of those had waited for; the live processes' CPU comes from /proc. A
    process whose parent ignores SIGCHLD (Ray's raylet does, for its workers)
    is reaped by the kernel with no trace in any cutime: its CPU as last seen is
    kept (what it used after the last sample is missed)."""

    def __init__(self, root):
        self.root, self.base, self.me = root, children_cpu(), os.getpid()
        self.unreaped = {}  # (pid, starttime): CPU last seen, of children of SIGCHLD-ignorers

    def reap(self, table):
        """Waits for this process's zombie children other than the root (adopted orphans)."""
        for pid, (ppid, state, _, start) in table.items():
            if ppid == self.me and pid != self.root and state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                self.unreaped.pop((pid, start), None)  # in RUSAGE_CHILDREN now

    def sample(self):
        table = proc_table()
        self.reap(table)
        reaped = children_cpu() - self.base
        tree = descendants(table, self.me)
        live, ignorers = set(), {}
        for pid in tree:
            ppid, _, cpu, start = table[pid]
            key = (pid, start)
            live.add(key)
            if ppid not in ignorers:  # read each time: a process may start ignoring it late
                ignorers[ppid] = ppid != self.me and ignores_sigchld(ppid)
            if ignorers[ppid]:
                self.unreaped[key] = cpu
            else:  # adopted by this process, or its parent waits for it
                self.unreaped.pop(key, None)
        gone = sum(cpu for key, cpu in self.unreaped.items() if key not in live)
        return reaped + gone + sum(table[pid][2] for pid in tree)

    def orphans(self):
        table = proc_table()
        self.reap(table)
        return [pid for pid, row in table.items() if row[0] == self.me]

    def total(self):
        """Once the whole tree has ended and been waited for."""
        return children_cpu() - self.base + sum(self.unreaped.values())


def run_tree(cmd, env, deadline_s, sample_s, log_path):
    """Runs `cmd` and waits for its whole tree.

    Returns {"launched", "wall", "cpu", "samples": [(time, cpu)]}; exits on failure."""
    launched = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    cpu = TreeCpu(proc.pid)
    samples = [(launched, 0.0)]
    done = threading.Event()

    def sample():
        while not done.wait(sample_s):
            now = time.time()
            samples.append((now, cpu.sample()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code = proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    finally:
        done.set()
        sampler.join()
    ended = time.time()
    samples.append((ended, cpu.sample()))
    # Every descendant, waited: the orphans that this subreaper adopted end
    # (Ray's processes after its shutdown); stragglers get SIGTERM, then SIGKILL, by pid.
    waited_since = time.time()
    while True:
        left = cpu.orphans()
        if not left:
            break
        waited = time.time() - waited_since
        for pid in left:
            if waited > 20:
                try:
                    os.kill(pid, signal.SIGKILL if waited > 30 else signal.SIGTERM)
                except ProcessLookupError:
                    pass
        if waited > 60:
            print(f"warning: processes {left} of {cmd[0]} could not be waited for",
                  file=sys.stderr)
            break
        time.sleep(0.1)
    total = cpu.total()
    samples.append((time.time(), total))
    # The tree's CPU never falls: a sample above a later one counted a process
    # twice while it moved (reaped, reparented) between /proc reads.
    for i in range(len(samples) - 2, -1, -1):
        samples[i] = (samples[i][0], min(samples[i][1], samples[i + 1][1]))
    if code != 0:
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-40:])
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n{tail}")
    return {"launched": launched, "wall": ended - launched, "cpu": total, "samples": samples}


def cpu_at(samples, when):
    """The tree's CPU-seconds at `when`, interpolated between the samples around it."""
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t0 <= when <= t1:
            return c0 + (c1 - c0) * ((when - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return samples[-1][1]


# --- the experiments' results -------------------------------------------------------------

def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def parse_trainrun(exp_dir):
    """trainrun tune's DIR/EXP: {"trials": [{"name", "config", "status", "reports":
    [{"time", "iteration", "metrics"}]}]}, from experiment.json and each trial's
    result.jsonl, whatever keys are missing."""
    experiment = read_json(os.path.join(exp_dir, "experiment.json"), {})
    listed = [t for t in experiment.get("trials") or [] if isinstance(t, dict)]
    names = [t.get("name") for t in listed if t.get("name")]
    try:  # run directories that experiment.json does not name
        names += sorted(n for n in os.listdir(exp_dir) if n not in names and os.path.exists(
            os.path.join(exp_dir, n, "result.jsonl")))
    except OSError:
        pass
    meta = {t.get("name"): t for t in listed}
    trials = []
    for name in names:
        reports = []
        try:
            with open(os.path.join(exp_dir, name, "result.jsonl")) as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue  # a line being written
                    metrics = row.get("metrics")
                    if not isinstance(metrics, dict):
                        metrics = {k: v for k, v in row.items() if isinstance(v, (int, float))}
                    if isinstance(row.get("timestamp"), (int, float)):
                        reports.append({"time": float(row["timestamp"]),
                                        "iteration": row.get("iteration"), "metrics": metrics})
        except OSError:
            pass
        info = meta.get(name, {})
        trials.append({"name": name, "config": info.get("config") or {},
                       "status": info.get("status") or "unknown", "reports": reports})
    return {"trials": trials}


def parse_ray(out_path):
    """tune_ray.py's --out in parse_trainrun's form, with the in-driver times."""
    summary = read_json(out_path, {})
    trials = []
    for trial in summary.get("trials") or []:
        reports = [{"time": r["time"], "iteration": r.get("iteration"),
                    "metrics": r.get("metrics") or {}}
                   for r in trial.get("reports") or [] if isinstance(r.get("time"), (int, float))]
        trials.append({"name": trial.get("name"), "config": trial.get("config") or {},
                       "status": trial.get("status") or "unknown", "reports": reports})
    fit = None
    if isinstance(summary.get("fit_started"), float) and isinstance(summary.get("fit_ended"),
                                                                   float):
        fit = summary["fit_ended"] - summary["fit_started"]
    return {"trials": trials, "fit_s": fit}


def accuracies(result):
    """[(time, accuracy)] of every report, by time."""
    return sorted((r["time"], float(r["metrics"]["accuracy"])) for t in result["trials"]
                  for r in t["reports"] if isinstance(r["metrics"].get("accuracy"), (int, float)))


def reach(result, run, target):
    """(wall, CPU) from the launch to the first report of accuracy >= target; inf if none."""
    for when, accuracy in accuracies(result):
        if accuracy >= target - 1e-12:
            return when - run["launched"], cpu_at(run["samples"], when)
    return float("inf"), float("inf")


def row_of(result, run, epochs):
    values = [a for _, a in accuracies(result)]
    best = max(values) if values else float("nan")
    to_best = reach(result, run, best) if values else (float("inf"), float("inf"))
    full = sum(1 for t in result["trials"] if len(t["reports"]) >= epochs)
    return {"best": best, "to_best": to_best[0], "cpu_to_best": to_best[1],
            "wall": run["wall"], "cpu": run["cpu"], "full": full,
            "stopped": len(result["trials"]) - full,
            "epochs": sum(len(t["reports"]) for t in result["trials"]),
            "result": result, "run": run}


# --- the contenders ----------------------------------------------------------------------

def trainrun_command(args, scheduler, storage, name):
    cmd = [os.path.join(args.build, "trainrun"), "tune", "--plugin",
           os.path.join(args.build, "plugins", "fashion_mnist", "libfashion_mnist.so"),
           "--num-workers", "1", "--cpus-per-worker", "1"]
    for key, value in [("epochs", args.epochs), ("max_steps", args.batches),
                       ("eval_steps", args.eval_batches), ("seed", 0), ("log_every", 0)]:
        cmd += ["--config", f"{key}={value}"]
    for key, spec in SPACE.items():
        cmd += ["--param", trainrun_param(key, spec)]
    cmd += ["--num-samples", str(args.trials), "--seed", str(args.seed), "--metric", "accuracy",
            "--mode", "max", "--scheduler", scheduler,
            "--max-concurrent-trials", str(args.max_concurrent_trials)]
    if scheduler == "asha":
        cmd += ["--time-attr", "training_iteration", "--max-t", str(args.epochs),
                "--grace-period", str(args.grace_period),
                "--reduction-factor", f"{args.reduction_factor:g}"]
    elif scheduler == "pbt":
        cmd += ["--time-attr", "training_iteration",
                "--perturbation-interval", str(args.perturbation_interval),
                "--quantile-fraction", f"{args.quantile_fraction:g}",
                "--resample-probability", f"{args.resample_probability:g}"]
    return cmd + ["--storage-path", storage, "--name", name, "-q"]


def run_trainrun(args, scheduler, work, env):
    storage, name = os.path.join(work, "storage"), "tune"
    os.makedirs(storage, exist_ok=True)
    run = run_tree(trainrun_command(args, scheduler, storage, name), env, args.timeout,
                   args.sample_s, os.path.join(work, "log.txt"))
    return row_of(parse_trainrun(os.path.join(storage, name)), run, args.epochs)


def run_ray(args, scheduler, work, env, configs):
    out = os.path.join(work, "ray.json")
    cmd = [os.path.join(RAY_VENV, "bin", "python"), os.path.join(HERE, "tune_ray.py"), "search",
           "--out", out, "--storage", os.path.join(work, "storage"), "--scheduler", scheduler,
           "--epochs", str(args.epochs), "--batches", str(args.batches),
           "--eval-batches", str(args.eval_batches), "--grace-period", str(args.grace_period),
           "--reduction-factor", f"{args.reduction_factor:g}",
           "--max-concurrent-trials", str(args.max_concurrent_trials),
           "--num-cpus", str(args.max_concurrent_trials)]
    if configs:
        with open(os.path.join(work, "configs.json"), "w") as f:
            json.dump(configs, f)
        cmd += ["--configs", os.path.join(work, "configs.json")]
    else:
        cmd += ["--space", json.dumps(SPACE), "--trials", str(args.trials),
                "--seed", str(args.seed)]
    run = run_tree(cmd, env, args.timeout, args.sample_s, os.path.join(work, "log.txt"))
    return row_of(parse_ray(out), run, args.epochs)


def start_overhead(args, system, work, env):
    """(wall / K, in-driver fit / K or None) of K trivial trials, one at a time."""
    storage = os.path.join(work, "storage")
    if system == "trainrun":
        cmd = [os.path.join(args.build, "trainrun"), "tune", "--plugin",
               os.path.join(args.build, "tests", "plugins", "libtest_plugin.so"),
               "--entry", "steps", "--config", "steps=1", "--num-workers", "1",
               "--cpus-per-worker", "1", "--param", "x=uniform:0:1",
               "--num-samples", str(args.start_trials), "--seed", str(args.seed),
               "--metric", "loss", "--mode", "min", "--scheduler", "fifo",
               "--max-concurrent-trials", "1", "--storage-path", storage, "--name", "start", "-q"]
    else:
        cmd = [os.path.join(RAY_VENV, "bin", "python"), os.path.join(HERE, "tune_ray.py"),
               "start", "--out", os.path.join(work, "ray.json"), "--storage", storage,
               "--trials", str(args.start_trials), "--num-cpus", str(args.max_concurrent_trials)]
    run = run_tree(cmd, env, args.timeout, args.sample_s, os.path.join(work, "log.txt"))
    if system == "trainrun":
        result = parse_trainrun(os.path.join(storage, "start"))
        fit = None
    else:
        result = parse_ray(os.path.join(work, "ray.json"))
        fit = result["fit_s"] / args.start_trials if result["fit_s"] else None
    reported = sum(1 for t in result["trials"] if t["reports"])
    if reported != args.start_trials:
        print(f"warning: {system}'s start run: {reported} of {args.start_trials} trials reported",
              file=sys.stderr)
    return {"per_trial": run["wall"] / args.start_trials, "fit_per_trial": fit,
            "cpu_per_trial": run["cpu"] / args.start_trials}


def fifo_configs(row):
    """The trials' configs of trainrun FIFO's search (its SPACE keys), in order; [] if unknown."""
    configs = []
    for trial in row["result"]["trials"]:
        config = {k: trial["config"][k] for k in SPACE if k in trial["config"]}
        if len(config) != len(SPACE):
            return []
        configs.append(config)
    return configs


def check_ray():
    try:
        found = subprocess.run(
            [os.path.join(RAY_VENV, "bin", "python"), "-c",
             "import torch, pandas, ray.tune, ray.train.torch"],
            capture_output=True, timeout=300).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        found = False
    if not found:
        sys.exit(INSTALL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=50, help="training batches per epoch")
    parser.add_argument("--eval-batches", type=int, default=20,
                        help="test batches (of the trial's batch_size) per evaluation")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed")
    parser.add_argument("--max-concurrent-trials", type=int, default=2)
    parser.add_argument("--grace-period", type=int, default=1)
    parser.add_argument("--reduction-factor", type=float, default=2)
    parser.add_argument("--perturbation-interval", type=int, default=1)
    parser.add_argument("--quantile-fraction", type=float, default=0.25)
    parser.add_argument("--resample-probability", type=float, default=0.25)
    parser.add_argument("--tolerance", type=float, default=0.005,
                        help="absolute accuracy below a best that counts as reaching it")
    parser.add_argument("--start-trials", type=int, default=10,
                        help="K trivial trials for the per-trial start overhead")
    parser.add_argument("--ray-sampling", choices=["fifo", "own"], default="fifo",
                        help="Ray's configs: trainrun FIFO's, or drawn by Ray with --seed")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--storage", help="where the runs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    parser.add_argument("--sample-s", type=float, default=0.25, help="CPU sampling period")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    if not args.skip_ray:
        check_ray()
    # Orphans of the runs (Ray's processes) come to this process, to be waited for.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: not a child subreaper: orphans' CPU time may be missed", file=sys.stderr)
    contenders = TRAINRUN + ([] if args.skip_ray else RAY)
    rows = {c: [] for c in contenders}
    starts = {s: [] for s in ["trainrun"] + ([] if args.skip_ray else ["Ray Tune"])}
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
        root = os.path.abspath(args.storage) if args.storage else tmp
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"),
                   OMP_NUM_THREADS="1")
        for i in range(args.rounds):
            configs = []
            for contender in contenders:
                work = os.path.join(root, f"round{i}", contender.replace(" ", "-"))
                os.makedirs(work, exist_ok=True)
                print(f"round {i}: {contender} ...", file=sys.stderr, flush=True)
                if contender in TRAINRUN:
                    row = run_trainrun(args, contender.split()[-1].lower(), work, env)
                    if contender == "trainrun FIFO" and args.ray_sampling == "fifo":
                        configs = fifo_configs(row)
                        if not configs:
                            print("warning: trainrun FIFO's configs unknown: Ray draws its own",
                                  file=sys.stderr)
                else:
                    row = run_ray(args, contender.split()[-1].lower(), work, env, configs)
                rows[contender].append(row)
                if not args.keep:
                    shutil.rmtree(os.path.join(work, "storage"), ignore_errors=True)
            for system in starts:
                work = os.path.join(root, f"round{i}", f"start-{system.split()[0]}")
                os.makedirs(work, exist_ok=True)
                print(f"round {i}: {system} start overhead ...", file=sys.stderr, flush=True)
                starts[system].append(start_overhead(
                    args, "trainrun" if system == "trainrun" else "ray", work, env))
                if not args.keep:
                    shutil.rmtree(os.path.join(work, "storage"), ignore_errors=True)
        report(args, rows, starts)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def fmt(value, spec):
    if value is None or value != value:
        return "n/a"
    if value == float("inf"):
        return "not reached"
    return format(value, spec)


def report(args, rows, starts):
    tol = args.tolerance
    print(f"Hyperparameter search, FashionMNIST ResNet-18: {args.trials} trials of lr "
          f"loguniform(1e-4, 1e-1) x batch_size choice(32, 64, 128), seed {args.seed}, "
          f"{args.epochs} epochs of {args.batches} batches + {args.eval_batches} test batches, "
          f"1 worker of 1 CPU per trial, {args.max_concurrent_trials} at once "
          f"(median of {args.rounds}):")
    fifo = rows["trainrun FIFO"]
    width = max(len(c) for c in rows)
    print(f"  {'':{width}s} {'best':>6s} {'to best: s':>11s} {'CPU s':>8s} "
          f"{'to FIFO best-tol: s':>20s} {'CPU s':>8s} {'total s':>8s} {'CPU s':>8s} "
          f"{'full/stopped':>12s} {'epochs':>6s}")
    for contender, runs in rows.items():
        # The time to trainrun FIFO's best of the same round, within the tolerance.
        to_fifo = [reach(r["result"], r["run"], f["best"] - tol) for r, f in zip(runs, fifo)]
        print(f"  {contender:{width}s} {fmt(median(r['best'] for r in runs), '6.4f')} "
              f"{fmt(median(r['to_best'] for r in runs), '11.1f')} "
              f"{fmt(median(r['cpu_to_best'] for r in runs), '8.1f')} "
              f"{fmt(median(t[0] for t in to_fifo), '20.1f')} "
              f"{fmt(median(t[1] for t in to_fifo), '8.1f')} "
              f"{fmt(median(r['wall'] for r in runs), '8.1f')} "
              f"{fmt(median(r['cpu'] for r in runs), '8.1f')} "
              f"{median(r['full'] for r in runs):>5g}/{median(r['stopped'] for r in runs):<6g} "
              f"{median(r['epochs'] for r in runs):6g}")
    print(f"  per-trial start overhead ({args.start_trials} trivial trials one at a time, "
          f"wall / K):")
    for system, values in starts.items():
        fit = median(v["fit_per_trial"] for v in values)
        extra = f", {fit:.3f} s within Tuner.fit()" if fit == fit else ""
        print(f"    {system:9s} {median(v['per_trial'] for v in values):.3f} s per trial "
              f"(CPU {median(v['cpu_per_trial'] for v in values):.3f} s){extra}")

    def ratio(numerators, denominators):
        values = []
        for n, d in zip(numerators, denominators):
            values.append(n / d if d not in (0, float("inf")) else float("nan"))
        return median(values)

    asha = rows["trainrun ASHA"]
    goal1 = ratio([reach(a["result"], a["run"], f["best"] - tol)[0] for a, f in zip(asha, fifo)],
                  [f["to_best"] for f in fifo])
    print(f"  ratio trainrun ASHA's time to FIFO's best - {tol:g} / trainrun FIFO's time to its "
          f"best = {fmt(goal1, '.3f')} (goal <= 0.333)")
    if "Ray Tune ASHA" in rows:
        ray_asha = rows["Ray Tune ASHA"]
        goal2 = ratio([reach(a["result"], a["run"], r["best"] - tol)[0]
                       for a, r in zip(asha, ray_asha)], [r["to_best"] for r in ray_asha])
        print(f"  ratio trainrun ASHA's time to Ray Tune ASHA's best - {tol:g} / Ray Tune ASHA's "
              f"time to its best = {fmt(goal2, '.3f')} (goal <= 0.5)")
        goal3 = ratio([v["per_trial"] for v in starts["trainrun"]],
                      [v["per_trial"] for v in starts["Ray Tune"]])
        print(f"  ratio per-trial start overhead trainrun / Ray Tune = {fmt(goal3, '.3f')} "
              f"(goal <= 0.1)")
    else:
        print("  (--skip-ray: no Ray Tune ratios)")


if __name__ == "__main__":
    main()
