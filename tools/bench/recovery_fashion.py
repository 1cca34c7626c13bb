#!/usr/bin/env python3
"""What a failure costs a real training: FashionMNIST on ResNet-18, killed and recovered.

examples/lightning_fashion_mnist (train::Trainer, Adam 1e-3), or with --loop own
plugins/fashion_mnist (a loop of its own over loader.epochs(), train::optim's
Adam 1e-3), on 3 workers of this host: EPOCHS epochs of --batches batches of 32
per rank, a checkpoint at each epoch's end, validated on --val-batches batches
per rank of the test set.
Each round runs it four ways, in turn:
  undisturbed;
  undisturbed with --recovery in-place (what its per-step vote costs);
  rank 1 killed -9 at a random point of epoch 1 (seeded: the same point for
  both), recovered by --recovery restart (the group restarts from the epoch's
  checkpoint);
  the same kill, recovered by --recovery in-place (the survivors go on, and a
  replacement catches up from rank 0 at a step boundary).
It prints for each: the run's time, the optimizer steps done twice, the time
from the kill to the survivors' next step, the replacement's catch-up time
(kill to its first step with the group) and the final accuracy; then the
in-place run's accuracy and time against the undisturbed run's.

With --baselines, each round also runs the same recipe in PyTorch
(tools/bench/recovery_fashion_torch.py: DistributedDataParallel over gloo, a
DistributedSampler, Adam 1e-3, the same batches, evaluation and checkpoints) on
3 ranks, undisturbed and with rank 1 killed -9 in epoch 1, restarted from epoch
0's checkpoint:
  torchrun --max_restarts 1 --monitor_interval 1;
  Ray Train: a TorchTrainer on a local Ray cluster (127.0.0.1), 3 workers of 1
  CPU, FailureConfig(max_failures=1), checkpoints through ray.train.report and
  ray.train.get_checkpoint.
Their kill comes the round's fraction of epoch 0's time after epoch 0's
checkpoint, as trainrun's, but with epoch 0's time taken from rank 0's start
(its group formed, the data and model loaded) rather than from the launch:
their start-up, Ray's most of all, would push the kill late. Each rank writes
its pid to a file, which names the process to kill (under Ray, the
RayTrainWorker actor of rank 1). Their rows give the same columns, from rank 0's
events: the run's time from the launch (torchrun's, or the Ray driver's, the
cluster's start and shutdown included), rank 0's steps of the resumed epoch
done before the restart, the kill to rank 0's first step after the restart and
the last epoch's accuracy; then trainrun's kill to the survivors' next step
against theirs. They need torchrun (Debian's python3-torch) and Ray Train in a
virtual environment that sees Debian's PyTorch 1.13 (numpy 1.x for it, and the
newest pyarrow that runs with numpy 1.x):

  /usr/bin/python3 -m venv --system-site-packages /opt/trainrun-ray &&
    /opt/trainrun-ray/bin/pip install 'ray[train]==2.60.0' 'numpy==1.26.4' 'pyarrow==25.0.1'

  tools/bench/recovery_fashion.py [--build build] [--rounds 1] [--batches 40] [--loop own]
      [--baselines]
"""
import argparse
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

EPOCHS = 2
STEP_LINE = re.compile(r"^\[rank 0 [^\]]*\] epoch (\d+) step (\d+)/\d+[: ]")
HERE = os.path.dirname(os.path.abspath(__file__))
RAY_VENV = "/opt/trainrun-ray"
INSTALL = ("--baselines needs torchrun (apt-get install python3-torch) and Ray Train: "
           f"/usr/bin/python3 -m venv --system-site-packages {RAY_VENV} && {RAY_VENV}/bin/pip "
           "install 'ray[train]==2.60.0' 'numpy==1.26.4' 'pyarrow==25.0.1'")
TRAINRUN_MODES = ["undisturbed", "in-place, no kill", "restart", "in-place"]
BASELINE_MODES = ["torchrun, no kill", "torchrun restart", "Ray Train, no kill",
                  "Ray Train restart"]


def children_with_index(parent, index):
    """Pids of `parent`'s children started with --index `index`, oldest first."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == parent and b"--index" in args and args[args.index(b"--index") + 1] == str(
                index).encode():
            found.append(int(pid))
    return sorted(found)


def run(cmd, env, deadline_s, kill=None):
    """Runs `cmd`; kill(proc, began, deadline_s) kill -9s rank 1 and returns when.

    Returns (seconds, lines as (time, text), the kill's time or None)."""
    lines = []
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    reader = threading.Thread(
        target=lambda: [lines.append((time.time(), line.rstrip("\n"))) for line in proc.stdout])
    reader.start()
    killed = None
    try:
        if kill is not None:
            killed = kill(proc, began, deadline_s)
        code = proc.wait(timeout=deadline_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # with torchrun's workers, Ray's driver
        reader.join()
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n{tail}")
    return time.time() - began, lines, killed


def kill_trainrun(run_dir, fraction, proc, began, deadline_s):
    """Kill -9s rank 1 `fraction` of the time to epoch 0's report after that report."""
    result = os.path.join(run_dir, "result.jsonl")
    while time.time() - began < deadline_s:  # epoch 0's report
        if os.path.exists(result) and os.path.getsize(result) > 0:
            break
        time.sleep(0.05)
    epoch = time.time() - began
    time.sleep(fraction * epoch)
    victims = children_with_index(proc.pid, 1)
    if not victims:
        sys.exit("rank 1's worker was not found")
    killed = time.time()
    os.kill(victims[0], signal.SIGKILL)
    return killed


def read_events(events, rank):
    """recovery_fashion_torch.py's events of `rank`: [(time, pid, event, epoch, value)]."""
    rows = []
    try:
        with open(os.path.join(events, f"rank{rank}.txt")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 5:
                    rows.append((float(parts[0]), int(parts[1]), parts[2], int(parts[3]),
                                 float(parts[4])))
    except FileNotFoundError:
        pass
    return rows


def kill_baseline(events, fraction, proc, began, deadline_s):
    """Kill -9s rank 1 `fraction` of epoch 0's time (rank 0's start to its checkpoint) after it."""
    while time.time() - began < deadline_s and proc.poll() is None:
        rows = read_events(events, 0)
        saved = [t for t, _, event, epoch, _ in rows if event == "checkpoint" and epoch == 0]
        if saved:
            break
        time.sleep(0.05)
    else:
        sys.exit(f"no checkpoint of epoch 0 in {events}")
    started = min(t for t, _, event, _, _ in rows if event == "start")
    time.sleep(fraction * (saved[0] - started))
    with open(os.path.join(events, "rank1.pid")) as f:
        pid = int(f.read())
    killed = time.time()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        sys.exit(f"rank 1 (pid {pid}) had ended before its kill: try more --batches")
    return killed


def steps_at(lines, until):
    """rank 0's last (epoch, step) printed before `until`."""
    last = (0, 0)
    for when, text in lines:
        match = STEP_LINE.match(text)
        if match and when <= until:
            last = (int(match[1]), int(match[2]))
    return last


def trainrun_row(args, mode, name, fraction, results, env):
    """One trainrun run of `mode`: its row of the table."""
    if args.loop == "trainer":
        plugin = os.path.join(args.build, "examples", "lightning_fashion_mnist",
                              "liblightning_fashion_mnist.so")
        options = {"train_batches": args.batches, "val_batches": args.val_batches}
    else:
        plugin = os.path.join(args.build, "plugins", "fashion_mnist", "libfashion_mnist.so")
        options = {"max_steps": args.batches, "eval_steps": args.val_batches}
    cmd = [os.path.join(args.build, "trainrun"), "--plugin", plugin, "-n", "3", "--name", name,
           "--storage-path", results, "--cpus-per-worker", "1",
           "--config", f"epochs={EPOCHS}", "--config", "batch_size=32",
           "--config", "log_every=1"]
    for key, value in options.items():
        cmd += ["--config", f"{key}={value}"]
    if mode != "undisturbed":
        cmd += ["--max-failures", "1", "--recovery", mode.split(",")[0]]
    run_dir = os.path.join(results, name)
    kill = (functools.partial(kill_trainrun, run_dir, fraction)
            if mode in ("restart", "in-place") else None)
    seconds, lines, killed = run(cmd, env, 1800, kill)
    with open(os.path.join(run_dir, "result.jsonl")) as f:
        reports = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(run_dir, "run.json")) as f:
        info = json.load(f)
    if args.loop == "trainer":
        steps = reports[-1]["metrics"]["step"]
    else:  # rank 0's steps in each epoch, from the last report of each
        steps = sum({r["metrics"]["epoch"]: r["metrics"]["steps"] for r in reports}.values())
    row = {"seconds": seconds, "accuracy": reports[-1]["metrics"]["accuracy"],
           "steps": steps, "twice": 0, "next": None, "caught_up": None}
    if mode == "restart":
        epoch, step = steps_at(lines, killed)
        # The restart resumes from epoch 0's checkpoint: the steps
        # of epoch 1 done before the kill are done again.
        row["twice"] = step if epoch == 1 else 0
        restarted = min(when for when, text in lines if "attempt 2/" in text)
        row["next"] = min(when for when, text in lines
                          if when > restarted and STEP_LINE.match(text)) - killed
    elif mode == "in-place":
        recovery = info["attempts"][0]["recoveries"][0]
        row["twice"] = recovery["steps_lost"]
        row["next"] = recovery["seconds"]
        row["caught_up"] = recovery.get("caught_up_seconds")
    return row


def free_port():
    """A free TCP port of 127.0.0.1, for torchrun's store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def baseline_command(args, mode, run_dir):
    """The torchrun or Ray Train command line of `mode`, its events in run_dir/events."""
    script = os.path.join(HERE, "recovery_fashion_torch.py")
    options = ["--events", os.path.join(run_dir, "events"),
               "--storage", os.path.join(run_dir, "storage"), "--epochs", str(EPOCHS),
               "--batches", str(args.batches), "--val-batches", str(args.val_batches)]
    if mode.startswith("Ray Train"):
        return [os.path.join(RAY_VENV, "bin", "python"), script, "ray"] + options
    return ["torchrun", "--nproc_per_node", "3", "--max_restarts", "1",
            "--monitor_interval", "1", "--redirects", "2", "--tee", "1",
            "--log_dir", os.path.join(run_dir, "logs"), "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), script, "torchrun"] + options


def baseline_row(args, mode, name, fraction, results, env):
    """One torchrun or Ray Train run of `mode`: its row of the table, from rank 0's events."""
    run_dir = os.path.join(results, name)
    events = os.path.join(run_dir, "events")
    os.makedirs(events)
    os.makedirs(os.path.join(run_dir, "storage"))
    kill = (functools.partial(kill_baseline, events, fraction) if mode.endswith("restart")
            else None)
    seconds, _, killed = run(baseline_command(args, mode, run_dir), env, 1800, kill)
    rows = read_events(events, 0)
    steps = {(epoch, value) for _, _, event, epoch, value in rows if event == "step"}
    row = {"seconds": seconds, "steps": len(steps), "twice": 0, "next": None,
           "caught_up": None,
           "accuracy": [value for _, _, event, _, value in rows if event == "checkpoint"][-1]}
    if killed is not None:
        restarted, resumed = min((t, epoch) for t, _, event, epoch, _ in rows
                                 if event == "start" and t > killed)
        # The steps of the resumed epoch that the first group did are done again.
        row["twice"] = sum(1 for t, _, event, epoch, _ in rows
                           if event == "step" and t < restarted and epoch >= resumed)
        row["next"] = min(t for t, _, event, _, _ in rows
                          if event == "step" and t > restarted) - killed
    return row


def check_baselines():
    """Exits with the install command unless torchrun and Ray Train are there."""
    ray_python = os.path.join(RAY_VENV, "bin", "python")
    try:
        ray_found = subprocess.run([ray_python, "-c", "import torch, ray.train.torch"],
                                   capture_output=True, timeout=300).returncode == 0
    except FileNotFoundError:
        ray_found = False
    if shutil.which("torchrun") is None or not ray_found:
        sys.exit(INSTALL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--val-batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loop", choices=["trainer", "own"], default="trainer")
    parser.add_argument("--baselines", action="store_true",
                        help="also torchrun and Ray Train, undisturbed and restarted")
    args = parser.parse_args()
    if args.baselines:
        check_baselines()
    chooser = random.Random(args.seed)
    rows = {mode: [] for mode in TRAINRUN_MODES + (BASELINE_MODES if args.baselines else [])}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"),
                   OMP_NUM_THREADS="1")
        results = os.path.join(tmp, "results")
        for i in range(args.rounds):
            fraction = chooser.uniform(0.2, 0.7)
            for mode in rows:
                name = f"{mode.replace(', no kill', '-quiet').replace(' ', '-')}{i}"
                one_run = trainrun_row if mode in TRAINRUN_MODES else baseline_row
                rows[mode].append(one_run(args, mode, name, fraction, results, env))
    report(args, rows)


def report(args, rows):
    def median(mode, key):
        values = [r[key] for r in rows[mode] if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    loop = "train::Trainer" if args.loop == "trainer" else "a loop over loader.epochs()"
    print(f"FashionMNIST ResNet-18 ({loop}), 3 workers, {EPOCHS} epochs of {args.batches} batches "
          f"(a checkpoint each), rank 1 killed -9 in epoch 1 (median of {args.rounds}):")
    width = max(len(mode) for mode in rows)
    for mode in rows:
        print(f"  {mode:{width}s} run {median(mode, 'seconds'):7.1f} s, optimizer steps "
              f"{median(mode, 'steps'):g}, done twice {median(mode, 'twice'):g}, kill to the "
              f"survivors' next step {median(mode, 'next'):.3f} s, replacement caught up "
              f"{median(mode, 'caught_up'):.3f} s, accuracy {median(mode, 'accuracy'):.4f}")
    base = median("undisturbed", "accuracy")
    print(f"  accuracy in-place - undisturbed = {median('in-place', 'accuracy') - base:+.4f}, "
          f"restart - undisturbed = {median('restart', 'accuracy') - base:+.4f}")
    print(f"  ratio in-place, no kill/undisturbed (run time) = "
          f"{median('in-place, no kill', 'seconds') / median('undisturbed', 'seconds'):.3f}")
    print(f"  ratio in-place/undisturbed (run time) = "
          f"{median('in-place', 'seconds') / median('undisturbed', 'seconds'):.3f}, "
          f"restart/undisturbed = "
          f"{median('restart', 'seconds') / median('undisturbed', 'seconds'):.3f}")
    for baseline in ("torchrun restart", "Ray Train restart") if args.baselines else ():
        theirs = median(baseline, "next")
        print(f"  ratio kill to the survivors' next step: in-place/{baseline} = "
              f"{median('in-place', 'next') / theirs:.3f}, restart/{baseline} = "
              f"{median('restart', 'next') / theirs:.3f}")


if __name__ == "__main__":
    main()
