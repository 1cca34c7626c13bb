#!/usr/bin/env python3
"""Recovery benchmark: kill -9 of a worker to the first training step after the restart.

Both sides run a small DDP loop that checkpoints every step (an MLP 64-256-256-10,
Adam, batch 64 per rank, 2 workers on this host) and resume from the latest
checkpoint after a failure:
  trainrun: the ddp_plugin's `recovery` entry with --max-failures 1;
  torchrun: tools/bench/recovery_torchrun.py with --max_restarts 1 --monitor_interval 1.
Each round lets the run reach step KILL_AT, kill -9s rank 1, and takes the time
from the kill to the moment every rank has finished its first step after the
restart. Rounds alternate between the two; the ratio of medians is printed,
with where trainrun's time goes (from its controller log and the loop's events).
trainrun also runs with --no-standby (new worker processes started at the
restart rather than during the attempt), for comparison.
Target: trainrun / torchrun <= 0.25.

Then, in the same invocation, what a failure costs in work: the same loop with
a checkpoint every 10 steps and rank 1 killed at step IN_PLACE_KILL_AT, once
restarting the group (--recovery restart) and once with the survivor going
on in place (--recovery in-place), 10 ms between steps: the time from the kill
to the survivors' next step, and the steps done twice (0 in place; the steps since the last
checkpoint on a restart).

  tools/bench/recovery.py [--build build] [--rounds 5]
"""
import argparse
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 30
KILL_AT = 8
IN_PLACE_KILL_AT = 17  # 8 steps after the checkpoint of step 9


def read_events(events):
    """{rank: [(event, step, time, pid)]}"""
    out = {}
    for name in sorted(os.listdir(events)):
        rank = int(name[len("rank"):-len(".txt")])
        rows = []
        with open(os.path.join(events, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4:
                    rows.append((parts[0], int(parts[1]), float(parts[2]), int(parts[3])))
        out[rank] = rows
    return out


def wait_for_step(events, step, deadline):
    """Waits until rank 1 logged `step`; returns its pid."""
    while time.time() < deadline:
        try:
            rows = read_events(events).get(1, [])
        except (OSError, ValueError):
            rows = []
        for event, s, _, pid in rows:
            if event == "step" and s >= step:
                return pid
        time.sleep(0.005)
    sys.exit(f"no step {step} within the deadline")


def first_after(rows, event, when):
    return min(t for e, _, t, _ in rows if e == event and t > when)


def run_and_kill(cmd, events, env, log_path, kill_at):
    """Runs `cmd`, kill -9s rank 1 once it logged step `kill_at`; returns the kill's time."""
    os.makedirs(events)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            pid = wait_for_step(events, kill_at, time.time() + 120)
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            code = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    if code != 0:
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n{open(log_path).read()[-4000:]}")
    return killed


def one_round(cmd, events, env, log_path):
    killed = run_and_kill(cmd, events, env, log_path, KILL_AT)
    rows = read_events(events)
    # Every rank has done its first step after the restart.
    phases = {e: max(first_after(r, e, killed) for r in rows.values())
              for e in ("start", "loaded", "step")}
    return killed, phases


def work_lost_round(trainrun, plugin, tmp, env, name, recovery):
    """Kill to the survivors' next step, and the steps done twice."""
    events = os.path.join(tmp, name)
    cmd = [trainrun, "--plugin", plugin, "--entry", "recovery", "-n", "2", "-q",
           "--max-failures", "1", "--recovery", recovery,
           "--storage-path", os.path.join(tmp, "results"), "--name", name,
           "--cpus-per-worker", "1", "--config", f"events={events}",
           "--config", f"steps={STEPS}", "--config", "checkpoint_every=10",
           "--config", "sleep_ms=10"]
    killed = run_and_kill(cmd, events, env, os.path.join(tmp, f"{name}.log"), IN_PLACE_KILL_AT)
    survivor = read_events(events)[0]  # rank 0 goes on (in place) or restarts
    # A restart's next step is the new group's first; a step rank 0 finished
    # meanwhile in the old one is thrown away with it.
    since = first_after(survivor, "loaded", killed) if recovery == "restart" else killed
    done = max(s for e, s, t, _ in survivor if e == "step" and t <= since)
    first_time, first_step = min((t, s) for e, s, t, _ in survivor if e == "step" and t > since)
    return first_time - killed, done + 1 - first_step


def controller_times(run_dir):
    """The controller's log lines that mark detection and the restart, as unix times."""
    marks = {}
    with open(os.path.join(run_dir, "logs", "controller.log")) as f:
        for line in f:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            if "was killed by SIGKILL" in line and "detected" not in marks:
                marks["detected"] = stamp
            elif "attempt 2/" in line and "restarting" not in marks:
                marks["restarting"] = stamp
    return marks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    trainrun = os.path.join(args.build, "trainrun")
    plugin = os.path.join(args.build, "tests", "plugins", "libddp_plugin.so")
    ours, cold, theirs, parts = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"),
                   OMP_NUM_THREADS="1")
        for i in range(args.rounds):
            for standby in (True, False):
                name = f"r{i}" if standby else f"cold{i}"
                events = os.path.join(tmp, name)
                killed, phases = one_round(
                    [trainrun, "--plugin", plugin, "--entry", "recovery", "-n", "2", "-q",
                     "--max-failures", "1", "--storage-path", os.path.join(tmp, "results"),
                     "--name", name, "--cpus-per-worker", "1", "--config", f"events={events}",
                     "--config", f"steps={STEPS}"] + ([] if standby else ["--no-standby"]),
                    events, env, os.path.join(tmp, f"{name}.log"))
                if not standby:
                    cold.append(phases["step"] - killed)
                    continue
                ours.append(phases["step"] - killed)
                marks = controller_times(os.path.join(tmp, "results", name))
                parts.append({
                    "detect": marks["detected"] - killed,
                    "stop": marks["restarting"] - marks["detected"],
                    "assign+plugin+group": phases["start"] - marks["restarting"],
                    "checkpoint load": phases["loaded"] - phases["start"],
                    "first step": phases["step"] - phases["loaded"],
                })
            events = os.path.join(tmp, f"theirs{i}")
            killed, phases = one_round(
                ["torchrun", "--nproc_per_node", "2", "--max_restarts", "1",
                 "--monitor_interval", "1", "--redirects", "2", "--tee", "1",
                 "--log_dir", os.path.join(tmp, f"torchrun-logs{i}"),
                 os.path.join(HERE, "recovery_torchrun.py"), events,
                 os.path.join(tmp, f"theirs{i}.pt"), str(STEPS)],
                events, env, os.path.join(tmp, f"theirs{i}.log"))
            theirs.append(phases["step"] - killed)
        lost = {"restart": [], "in-place": []}
        for i in range(args.rounds):
            for recovery in ("restart", "in-place"):
                lost[recovery].append(
                    work_lost_round(trainrun, plugin, tmp, env, f"{recovery}{i}", recovery))
    t, b = statistics.median(ours), statistics.median(theirs)
    print(f"recovery: kill -9 of rank 1 to every rank's first step after the restart "
          f"(2 workers, median of {args.rounds}):")
    print(f"  trainrun  {t:7.3f} s   rounds: {' '.join(f'{x:.3f}' for x in ours)}")
    print(f"  trainrun --no-standby  {statistics.median(cold):7.3f} s   rounds: "
          f"{' '.join(f'{x:.3f}' for x in cold)}")
    print(f"  torchrun  {b:7.3f} s   rounds: {' '.join(f'{x:.3f}' for x in theirs)}")
    print(f"  ratio trainrun/torchrun = {t / b:.3f}  (target <= 0.25)")
    print(f"  ratio trainrun --no-standby/torchrun = {statistics.median(cold) / b:.3f}")
    print("  where trainrun's time goes (medians; the standby workers started during the attempt):")
    for key in parts[0]:
        print(f"    {key:22s} {statistics.median(p[key] for p in parts):7.3f} s")
    print(f"work lost: a checkpoint every 10 steps, rank 1 killed after step {IN_PLACE_KILL_AT} "
          f"(2 workers, median of {args.rounds}):")
    for recovery, rounds in lost.items():
        seconds = statistics.median(r[0] for r in rounds)
        steps = statistics.median(r[1] for r in rounds)
        print(f"  --recovery {recovery:8s} kill to the survivor's next step {seconds:7.3f} s, "
              f"steps done twice {steps:g}   rounds: "
              f"{' '.join(f'{r[0]:.3f}/{r[1]}' for r in rounds)}")
    ratio = statistics.median(r[0] for r in lost["in-place"]) / statistics.median(
        r[0] for r in lost["restart"])
    print(f"  ratio in-place/restart (kill to next step) = {ratio:.3f}")


if __name__ == "__main__":
    main()
