#!/usr/bin/env python3
"""The FashionMNIST ResNet-18 step on one GPU: trainrun against Python, interleaved.

Each round runs, one after the other, at each batch size (128 and 512 by default):
  trainrun     trainrun -n 1 --use-gpu, the fashion_mnist plugin (train::optim's Adam,
               train::TensorDataset, prepare_model and prepare_data_loader)
  resident_tr  the same with the training set in GPU memory (config resident=true)
  captured_tr  the same with each step captured as a CUDA graph (config capture=true)
  torchrun     torchrun --nproc_per_node 1 ddp_torchrun.py: DDP on NCCL, a DataLoader
  loader       plain PyTorch, a DataLoader, no DDP        (plain_step.py --mode loader)
  resident     plain PyTorch, the dataset on the GPU       (plain_step.py --mode resident)
  graph        the same step captured as a CUDA graph      (plain_step.py --mode graph)
and with --trainer also, at the same place in each round:
  trainer      train::Trainer (examples/lightning_fashion_mnist), eager
  trainer_cap  the same with TrainerOptions::capture (config capture=true)
whose rate comes from two runs, to the warm-up's end and to the steps' end: the
difference of their times to the last report, so that start-up cancels out;
and prints min / median / max samples/s of each over the rounds, then the ratios of
the medians against the targets. GPU rounds move by +-15%: only medians of
interleaved rounds of one invocation mean anything. With --skip NAME (repeatable)
a side is left out; --device cpu runs the eager sides on the CPU with few steps, to
check the script itself.

At each batch size it runs the sides that the targets there compare (and the Trainer's
with --trainer); --all-sides runs every side at every batch size. The sides take turns
at going first, one place a round, and the table is printed after every round. With
--budget S it begins a round only while the longest round so far still fits in S
seconds. Every run is bounded: by 3x its side's longest run so far, and a side's
first by 180 s or a third of the budget left (none under --least-run-limit, 60 s);
and by the budget's end. A run past its bound is ended with every process it
started, orphans included (SIGTERM, then SIGKILL). A side that fails or runs past its
own bound is named and left out of the later rounds, and the others go on; the exit
status is 1 if any failed. One cut by the budget's end ends the bench. A round the budget or a stop
(SIGTERM, SIGINT) cuts short keeps the runs it finished: each ratio compares the
rounds in which both of its sides ran, and under 3 of them assesses no target.

  tools/bench/gpu_step.py [--build build] [--rounds 5] [--batch 128 --batch 512]
                          [--torchrun PATH] [--data-dir DIR] [--skip graph]... [--trainer]
                          [--all-sides] [--budget SECONDS] [--least-run-limit SECONDS]
"""
import argparse
import ctypes
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = ["trainrun", "resident_tr", "captured_tr", "torchrun", "loader", "resident", "graph"]
TRAINER_SIDES = ["trainer", "trainer_cap"]
FASHION_PLUGIN = os.path.join("plugins", "fashion_mnist", "libfashion_mnist.so")
TRAINER_PLUGIN = os.path.join("examples", "lightning_fashion_mnist", "liblightning_fashion_mnist.so")
# The ratios of medians the GPU work is held to, at a batch size: (numerator,
# denominator, batch, target).
TARGETS = [("trainrun", "torchrun", 128, 1.3), ("trainrun", "resident", 128, 1.0),
           ("resident_tr", "resident", 128, 1.0), ("captured_tr", "graph", 128, 0.7),
           ("trainrun", "loader", 512, 1.3)]
# What the Trainer's loop costs, and what its capture buys (no targets).
TRAINER_RATIOS = [("trainer", "trainrun"), ("trainer_cap", "captured_tr"),
                  ("trainer_cap", "graph")]
# The bound of a side's first run (of both runs of a Trainer side; with --budget, a
# third of what is left, if more than --least-run-limit), and the default least
# bound of any run (a later one's is 3x the side's longest).
FIRST_RUN_LIMIT_S = 180
LEAST_RUN_LIMIT_S = 60
# What a run's processes are given to end after SIGTERM (torchrun ends its workers,
# which run in sessions of their own), then after SIGKILL.
TERM_GRACE_S = 10
KILL_GRACE_S = 2
# Fewer rounds than this in common assess no target.
MIN_ROUNDS = 3
PR_SET_CHILD_SUBREAPER = 36


class SideFailed(Exception):
    """A run of one side failed: its exit status, its output, or its bound."""

    def __init__(self, message, timed_out=False):
        super().__init__(message)
        self.timed_out = timed_out


class BudgetSpent(Exception):
    """--budget's seconds ran out during a round, in the side named."""


class Stopped(Exception):
    """SIGTERM or SIGINT: stop, and print what the rounds measured."""


class StopGate:
    """Holds SIGTERM and SIGINT back while a child starts (unnamed, it could not be
    ended) and while a run's processes are ended. Not a signal mask: children would
    inherit it, and ignore their SIGTERM. The first stop is the only one raised."""
    held = False
    pending = None
    stopping = False


def stop(signum, _frame):
    if StopGate.stopping:
        return
    name = signal.Signals(signum).name
    if StopGate.held:
        StopGate.pending = name
    else:
        StopGate.stopping = True
        raise Stopped(name)


def hold_stops():
    StopGate.held = True


def release_stops(defer=False):
    """Raises Stopped if a stop came while they were held; with `defer`, leaves it
    for raise_deferred_stop()."""
    StopGate.held = False
    if not defer:
        raise_deferred_stop()


def raise_deferred_stop():
    if StopGate.pending and not StopGate.stopping:
        StopGate.stopping = True
        raise Stopped(StopGate.pending)


def descendants():
    """The processes below this one. As a child subreaper it inherits the orphans of
    its runs (torchrun's workers when torchrun is gone), so these are every process
    a run started and left."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def end_all(process=None, defer_stop=False):
    """Ends a run and whatever it left: SIGTERM to its session (trainrun's controller
    and torchrun end their workers on it) and to every process below this one, then,
    after TERM_GRACE_S, SIGKILL. Reaps the orphans; `process` is Popen's to reap.
    A stop meanwhile is raised as it ends, or with `defer_stop` left for
    raise_deferred_stop()."""
    hold_stops()
    try:
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
            if process is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
            for pid in descendants():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            waited = time.monotonic() + grace
            while time.monotonic() < waited:
                if process is not None:
                    process.poll()
                for pid in descendants():
                    if process is None or pid != process.pid:
                        try:
                            os.waitpid(pid, os.WNOHANG)  # an orphan, now ours
                        except ChildProcessError:
                            pass  # not our child: its parent reaps it
                if (process is None or process.returncode is not None) and not descendants():
                    return
                time.sleep(0.1)
    finally:
        release_stops(defer=defer_stop)


def run(cmd, env, deadline):
    """Runs cmd in a session of its own, ended with all its processes when it runs
    past `deadline` (time.monotonic()'s) or the bench is stopped. Its output goes to
    a file, not a pipe, which a process it leaves behind would hold open."""
    raise_deferred_stop()  # one that came while the last run's leftovers were ended
    limit = max(1.0, deadline - time.monotonic())
    with tempfile.TemporaryFile() as output:
        hold_stops()
        try:
            process = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        except BaseException:
            release_stops()
            raise
        try:
            release_stops()
            process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            end_all(process)
            raise SideFailed(f"ran past its {limit:.0f} s: {' '.join(cmd)}\n{tail(output)}",
                             timed_out=True) from None
        except BaseException:
            end_all(process)
            raise
        # What it left, if anything. A stop meanwhile waits until the run's rate,
        # or its failure, is kept (Bench.run_round).
        end_all(process, defer_stop=True)
        if process.returncode != 0:
            raise SideFailed(f"exited {process.returncode}: {' '.join(cmd)}\n{tail(output)}")
        output.seek(0)
        return output.read().decode(errors="replace")


def tail(output):
    output.seek(0)
    return output.read().decode(errors="replace")[-3000:]


def json_line(out):
    line = next(l for l in reversed(out.splitlines()) if "samples_per_s" in l)
    return json.loads(line[line.index("{"):])["samples_per_s"]


def steps_for(args, batch):
    """Warm-up and timed steps within one epoch of 60000 images."""
    if args.device == "cpu":
        return 1, 3
    warmup, steps = args.warmup, args.steps
    while (warmup + steps) * batch > 60000:
        steps //= 2
    return warmup, steps


def last_report(args, tmp, env, plugin, run_name, config, deadline):
    """The last report of `trainrun -n 1` running `plugin` (a path under --build) as
    run_name, a name of its own: the same name again would resume that run."""
    results = os.path.join(tmp, "results")
    placement = ["--use-gpu"] if args.device == "cuda" else ["--cpus-per-worker", "1"]
    cmd = [os.path.join(args.build, "trainrun"), "--plugin", os.path.join(args.build, plugin),
           "-n", "1", *placement, "-q", "--storage-path", results, "--name", run_name]
    if args.data_dir:
        config = [f"data_dir={args.data_dir}", *config]
    for item in config:
        cmd += ["--config", item]
    run(cmd, env, deadline)
    with open(os.path.join(results, run_name, "result.jsonl")) as f:
        return json.loads(f.readlines()[-1])


def trainer_side(args, name, batch, tmp, env, serial, deadline):
    """samples/s of the Trainer's steps after the warm-up, from two runs' times."""
    warmup, steps = steps_for(args, batch)
    times = [last_report(args, tmp, env, TRAINER_PLUGIN, f"{name}{batch}-{serial}-{last}",
                         ["epochs=1", "val_batches=0", "log_every=0", f"batch_size={batch}",
                          f"max_steps={last}",
                          f"capture={'true' if name == 'trainer_cap' else 'false'}"],
                         deadline)["time_total_s"]
             for last in (warmup, warmup + steps)]
    if times[1] - times[0] <= 0:
        raise SideFailed(f"{warmup + steps} steps took no longer than {warmup} "
                         f"({times[1]:.2f} s against {times[0]:.2f} s): too few --steps to rate")
    return batch * steps / (times[1] - times[0])


def side(args, name, batch, tmp, env, serial, deadline):
    """samples/s of one run of side `name` at `batch`; raises SideFailed."""
    try:
        rate = float(measure(args, name, batch, tmp, env, serial, deadline))
    except (OSError, StopIteration, KeyError, IndexError, ValueError, TypeError) as e:
        raise SideFailed(f"no samples/s in what it left: {e!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise SideFailed(f"a rate of {rate} samples/s")
    return rate


def measure(args, name, batch, tmp, env, serial, deadline):
    if name in TRAINER_SIDES:
        return trainer_side(args, name, batch, tmp, env, serial, deadline)
    warmup, steps = steps_for(args, batch)
    if name in ("trainrun", "resident_tr", "captured_tr"):
        return last_report(args, tmp, env, FASHION_PLUGIN, f"{name}{batch}-{serial}",
                           ["epochs=1", "eval=false", "log_every=0", f"batch_size={batch}",
                            f"warmup_steps={warmup}", f"max_steps={warmup + steps}",
                            f"resident={'true' if name == 'resident_tr' else 'false'}",
                            f"capture={'true' if name == 'captured_tr' else 'false'}"],
                           deadline)["metrics"]["samples_per_s"]
    if name == "torchrun":
        return json_line(run([args.torchrun, "--nproc_per_node", "1", "--redirects", "2",
                              "--tee", "1", "--log_dir", os.path.join(tmp, f"log{batch}-{serial}"),
                              os.path.join(HERE, "ddp_torchrun.py"), "--warmup", str(warmup),
                              "--steps", str(steps), "--batch", str(batch),
                              "--device", args.device], env, deadline))
    return json_line(run([args.python, os.path.join(HERE, "plain_step.py"), "--mode", name,
                          "--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps),
                          "--device", args.device], env, deadline))


def sides_at(args, batch):
    """The sides run at `batch`: those the targets there compare, and the Trainer's with
    --trainer; every side with --all-sides. --skip and --device cpu leave some out."""
    named = {name for top, bottom, b, _ in TARGETS if b == batch for name in (top, bottom)}
    gpu_only = {"graph", "resident_tr", "captured_tr", "trainer_cap"}
    candidates = SIDES + (TRAINER_SIDES if args.trainer else [])
    return [s for s in candidates
            if (args.all_sides or s in named or s in TRAINER_SIDES) and s not in args.skip
            and not (s in gpu_only and args.device == "cpu")]


def print_line(r, b, line):
    print(f"round {r} batch {b}: " + "  ".join(line) + " samples/s", flush=True)


class Bench:
    """The rounds' results: rows[(side, batch)] maps a round to its samples/s."""

    def __init__(self, args, batches, env, tmp, end):
        self.args, self.env, self.tmp, self.end = args, env, tmp, end
        self.sides = {b: sides_at(args, b) for b in batches}
        self.batches = [b for b in batches if self.sides[b]]
        self.rows = {(s, b): {} for b in self.batches for s in self.sides[b]}
        self.failed = {}  # (side, batch): why; left out of the later rounds
        self.longest = {}  # (side, batch): its longest run, in seconds
        self.rounds = 0  # complete ones
        self.current = 0

    def limit(self, s, b):
        """The bound of the next run of side s at batch b, in seconds: its own, which
        the budget's end may cut shorter still."""
        least = self.args.least_run_limit
        longest = self.longest.get((s, b))
        if longest is not None:
            return max(least, 3 * longest)
        if self.end is None:
            return FIRST_RUN_LIMIT_S
        return min(FIRST_RUN_LIMIT_S, max(least, (self.end - time.monotonic()) / 3))

    def run_round(self, r):
        """Runs each side at each batch size once, printing a line a batch size; the
        sides take turns at going first. Each run's value is kept as it comes. Raises
        BudgetSpent when the budget's end comes first."""
        self.current = r
        for b in self.batches:
            turn = r % len(self.sides[b])
            line = []
            for s in self.sides[b][turn:] + self.sides[b][:turn]:
                if (s, b) in self.failed:
                    continue
                began = time.monotonic()
                if self.end is not None and began >= self.end:
                    print_line(r, b, line)
                    raise BudgetSpent(f"before {s} at batch {b}")
                deadline = began + self.limit(s, b)
                budget_bound = self.end is not None and self.end <= deadline
                if budget_bound:
                    deadline = self.end
                try:
                    value = side(self.args, s, b, self.tmp, self.env, r, deadline)
                except SideFailed as e:
                    if e.timed_out and budget_bound:
                        print_line(r, b, line)
                        raise BudgetSpent(f"during {s} at batch {b}") from e
                    self.failed[(s, b)] = f"round {r}: {e}"
                    line.append(f"{s} failed")
                else:
                    self.rows[(s, b)][r] = value
                    self.longest[(s, b)] = max(self.longest.get((s, b), 0.0),
                                               time.monotonic() - began)
                    line.append(f"{s} {value:.0f}")
                try:
                    raise_deferred_stop()
                except Stopped:
                    print_line(r, b, line)
                    raise
            print_line(r, b, line)
        self.rounds += 1

    def summary(self):
        """Prints min / median / max of every side with values, then the ratios of the
        medians over the rounds both sides of a ratio ran."""
        print(f"FashionMNIST ResNet-18, 1 process on {self.args.device}, samples/s over "
              f"{self.rounds} complete interleaved round(s) of {self.args.rounds} "
              "(min / median / max):", flush=True)
        for b in self.batches:
            for s in self.sides[b]:
                values = list(self.rows[(s, b)].values())
                if values:
                    print(f"  batch {b:4d}  {s:<11} {min(values):9.0f} "
                          f"{statistics.median(values):9.0f} {max(values):9.0f}  "
                          f"({len(values)} rounds)")
        ratios = [(top, bottom, b, target) for top, bottom, b, target in TARGETS]
        ratios += [(top, bottom, b, None) for top, bottom in TRAINER_RATIOS for b in self.batches]
        ratios += [("graph", "resident", b, "capture") for b in self.batches]
        for top, bottom, b, target in ratios:
            if (top, b) not in self.rows or (bottom, b) not in self.rows:
                continue
            common = sorted(set(self.rows[(top, b)]) & set(self.rows[(bottom, b)]))
            if not common:
                continue
            ratio = (statistics.median(self.rows[(top, b)][r] for r in common)
                     / statistics.median(self.rows[(bottom, b)][r] for r in common))
            note = f"  ({len(common)} rounds)"
            if target == "capture":
                note = f"  (what capture buys Python; {len(common)} rounds)"
            elif target is not None and len(common) < MIN_ROUNDS:
                note = f"  (target not assessed: {len(common)} round(s) in common)"
            elif target is not None:
                note = f"  (target >= {target}; {len(common)} rounds)"
            print(f"  batch {b}: {top} / {bottom} = {ratio:.3f}{note}", flush=True)


def ignore_stops():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, action="append", help="128 and 512 by default")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--torchrun", default="torchrun")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--data-dir", help="the FashionMNIST folder (the Debian package's)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--skip", action="append", default=[], choices=SIDES + TRAINER_SIDES)
    parser.add_argument("--trainer", action="store_true",
                        help="also train::Trainer, eager and captured (two runs a side)")
    parser.add_argument("--all-sides", action="store_true",
                        help="every side at every batch size, not only those the targets compare")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="begin no round that the longest so far says would end after this")
    parser.add_argument("--least-run-limit", type=float, default=LEAST_RUN_LIMIT_S,
                        metavar="SECONDS", help="the least bound of a run (60)")
    args = parser.parse_args()
    if args.rounds < 1 or (args.budget is not None and args.budget <= 0) \
            or args.least_run_limit <= 0:
        parser.error("--rounds, --budget and --least-run-limit must be positive")
    batches = args.batch or [128, 512]
    if not any(sides_at(args, b) for b in batches):
        parser.error("no side to run at these batch sizes (the targets name 128 and 512; "
                     "--all-sides runs every side at any)")
    env = dict(os.environ)
    if args.data_dir:
        env["FASHION_MNIST_DIR"] = args.data_dir
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    # The orphans of a run (torchrun's workers) become this process's, to be ended.
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"gpu_step.py: not a child subreaper ({os.strerror(ctypes.get_errno())}): the "
              "workers a run leaves in sessions of their own may outlive it", file=sys.stderr)
    start = time.monotonic()
    end = None if args.budget is None else start + args.budget
    tmp = tempfile.mkdtemp(prefix="gpu_step-")
    env["TRAINRUN_CACHE_DIR"] = os.path.join(tmp, "cache")
    bench = Bench(args, batches, env, tmp, end)
    failed = False
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        longest_round = 0.0
        for r in range(args.rounds):
            began = time.monotonic()
            if end is not None and r > 0 and began + longest_round > end:
                print(f"round {r}: not begun, {end - began:.0f} s of the budget left and a "
                      f"round takes up to {longest_round:.0f} s", flush=True)
                break
            try:
                bench.run_round(r)
            except BudgetSpent as e:
                print(f"round {r}: the budget ran out {e}; its finished runs are kept",
                      flush=True)
                break
            longest_round = max(longest_round, time.monotonic() - began)
            if r + 1 < args.rounds:
                bench.summary()
        ignore_stops()
    except Stopped as e:
        ignore_stops()
        failed = True
        print(f"stopped by {e} in round {bench.current}; its finished runs are kept", flush=True)
    except Exception:  # a defect of the bench's own: what it measured still counts
        ignore_stops()
        failed = True
        traceback.print_exc()
    finally:
        ignore_stops()
        end_all()
        shutil.rmtree(tmp, ignore_errors=True)
    bench.summary()
    for (s, b), why in bench.failed.items():
        print(f"FAILED {s} at batch {b}, left out after {why}", file=sys.stderr)
    if failed or bench.failed or bench.rounds == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
