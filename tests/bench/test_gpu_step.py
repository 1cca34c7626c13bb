#!/usr/bin/env python3
"""tools/bench/gpu_step.py's own behaviour, with stand-ins for what it runs.

A GPU machine is lent for minutes: the one call that measures on it must yield a
table whatever happens. This runs gpu_step.py against a stand-in trainrun, torchrun
and python (this file, in another role), each told by the environment to succeed with
a rate, fail, take a while or hang, and checks that:
  - the ratios are those of the medians, against the targets;
  - a side that fails is named, left out of the later rounds, and the others go on;
    each ratio compares the rounds in which both of its sides ran;
  - --budget begins no round that would not fit, and assesses no target on fewer
    than 3 rounds;
  - a run that hangs, even one that ignores SIGTERM, is ended at its bound with the
    processes it started in a session of their own (as torchrun starts its workers),
    and the other sides go on;
  - what a run leaves behind in a session of its own is ended after it;
  - SIGTERM prints the table of the runs finished, and one while a finished run's
    leftovers are ended keeps that run's rate.

  test_gpu_step.py REPO
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

# --- the stand-ins -----------------------------------------------------------


def stand_in(role, argv):
    """Behaves as `role` (trainrun, torchrun or python) as FAKE_<SIDE> says, one
    comma-separated item a run of that side: "RATE", "slow:SECONDS:RATE", "fail",
    "hang" (starts a child in a session of its own, as torchrun starts its workers,
    and ends it on SIGTERM, as torchrun does), "stubborn" (the same, but ignores
    SIGTERM) or "desert:RATE" (starts such a child and leaves it running). The last
    item holds for every later run."""
    if role == "trainrun":
        side = re.sub(r"\d+-\d+$", "", argv[argv.index("--name") + 1])
    elif role == "torchrun":
        side = "torchrun"
    else:
        side = argv[argv.index("--mode") + 1]
    log_path = os.environ["FAKE_LOG"]
    runs = sum(1 for line in open(log_path) if line.startswith(f"{side} ")) \
        if os.path.exists(log_path) else 0
    with open(log_path, "a") as log:
        log.write(f"{side} {os.getpid()}\n")
    items = os.environ.get(f"FAKE_{side.upper()}", "100").split(",")
    how = items[min(runs, len(items) - 1)].split(":")
    if how[0] == "fail":
        print(f"{side}: told to fail", file=sys.stderr)
        sys.exit(3)
    if how[0] in ("hang", "stubborn"):
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open(log_path, "a") as log:
            log.write(f"child {child.pid}\n")

        def end(_signum, _frame):
            child.kill()
            sys.exit(1)
        signal.signal(signal.SIGTERM, end if how[0] == "hang" else signal.SIG_IGN)
        time.sleep(600)
        sys.exit(1)
    if how[0] == "slow":
        time.sleep(float(how[1]))
    if how[0] in ("desert", "abandon"):
        ignore = signal.SIG_IGN if how[0] == "abandon" else signal.SIG_DFL
        child = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGTERM, ignore))
        with open(log_path, "a") as log:
            log.write(f"child {child.pid}\n")
    rate = float(how[-1])
    if role == "trainrun":
        folder = os.path.join(argv[argv.index("--storage-path") + 1],
                              argv[argv.index("--name") + 1])
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "result.jsonl"), "w") as f:
            f.write(json.dumps({"metrics": {"samples_per_s": rate}}) + "\n")
    else:
        print(json.dumps({"samples_per_s": rate}))


# --- the checks ----------------------------------------------------------------


def bench(repo, tmp, env_sides, *args, signal_after=None, once_gone=None):
    """Runs gpu_step.py on the CPU at batch 128 (trainrun, torchrun and resident:
    what the targets there compare on a CPU) with the stand-ins; returns its exit
    status, its output and the stand-ins' log. With signal_after, SIGTERM once the
    log has more lines than that, and with once_gone, once the first run of that
    side has also exited."""
    log = os.path.join(tmp, f"log{time.monotonic_ns()}")
    env = dict(os.environ, FAKE_LOG=log)
    env.update(env_sides)
    cmd = [sys.executable, os.path.join(repo, "tools", "bench", "gpu_step.py"), "--device", "cpu",
           "--batch", "128", "--build", tmp, "--torchrun", os.path.join(tmp, "torchrun"),
           "--python", os.path.join(tmp, "python"), *args]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        if signal_after is not None:
            # SIGTERM once the stand-ins' log shows that many runs begun.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and process.poll() is None:
                lines = open(log).read().split("\n") if os.path.exists(log) else []
                if len([line for line in lines if line]) > signal_after and (
                        once_gone is None or not any(
                            os.path.exists(f"/proc/{line.split()[1]}") for line in lines
                            if line.startswith(f"{once_gone} "))):
                    process.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.05)
        out, _ = process.communicate(timeout=120)
    finally:
        # On a failure of this test too: nothing of it is left running. What the bench
        # left is counted first, then ended (each a stand-in or its sleep, by its
        # command line, not a process that took a reused pid).
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        lines = open(log).read().split("\n") if os.path.exists(log) else []
        survivors = [int(line.split()[1]) for line in lines if line
                     if alive(int(line.split()[1]), tmp)]
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return process.returncode, out, lines, survivors


def check(condition, what, out):
    if not condition:
        sys.exit(f"FAILED: {what}\n--- gpu_step.py said:\n{out}")
    print(f"ok: {what}")


def alive(pid, tmp):
    """Whether pid is a live stand-in of this test's (its command line names `tmp`) or
    one's `sleep 600`; a zombie is ended, its parent has not reaped it yet."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and (tmp in cmdline or cmdline.startswith("sleep\x00600"))


def main():
    repo = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        for role in ("trainrun", "torchrun", "python"):
            path = os.path.join(tmp, role)
            with open(path, "w") as f:
                f.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, "
                        f"{os.path.dirname(os.path.abspath(__file__))!r})\n"
                        f"import test_gpu_step\ntest_gpu_step.stand_in({role!r}, sys.argv)\n")
            os.chmod(path, 0o755)

        # Rates that differ by round: a median is not a mean, nor a ratio of rounds.
        rc, out, _, _ = bench(repo, tmp, {"FAKE_TRAINRUN": "100,400,200", "FAKE_TORCHRUN": "100",
                                       "FAKE_RESIDENT": "50,100,100"}, "--rounds", "3")
        check(rc == 0 and "3 complete interleaved round(s) of 3" in out
              and "trainrun / torchrun = 2.000  (target >= 1.3; 3 rounds)" in out
              and "trainrun / resident = 2.000  (target >= 1.0; 3 rounds)" in out,
              "three rounds give the ratios of the medians against the targets", out)

        # resident fails in round 1: its ratio compares round 0 alone (100 / 50), and
        # assesses no target; torchrun goes on in every round.
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_TRAINRUN": "100,400,200",
                                         "FAKE_RESIDENT": "50,fail"}, "--rounds", "3")
        check(rc == 1 and "FAILED resident at batch 128, left out after round 1" in out
              and sum(1 for line in log if line.startswith("resident ")) == 2
              and sum(1 for line in log if line.startswith("torchrun ")) == 3
              and "trainrun / resident = 2.000  (target not assessed: 1 round(s) in common)"
              in out and "trainrun / torchrun = 2.000  (target >= 1.3; 3 rounds)" in out,
              "a side that fails is named and left out, the others go on, and each ratio "
              "compares the rounds both of its sides ran", out)

        # How many rounds fit depends on the machine's load; whatever it is, no round
        # begins once the budget is spent, and the last one is not begun or cut short.
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_TRAINRUN": "slow:1:100"},
                                        "--rounds", "10", "--budget", "9")
        done = re.findall(r"(\d+) complete interleaved round\(s\) of 10", out)
        rounds = int(done[-1]) if done else -1  # the last table's
        check(rc == 0 and 1 <= rounds < 10
              and (f"round {rounds}: not begun" in out or f"round {rounds}: the budget ran out"
                   in out)
              and (rounds >= 3 or f"(target not assessed: {rounds} round(s) in common)" in out),
              "--budget begins no round that would not fit, and under 3 rounds assess no target",
              out)

        # torchrun ignores SIGTERM, and its worker runs in a session of its own: both
        # are ended at its bound (a third of the budget: 10 s, then SIGKILL 10 s after
        # SIGTERM), and the other sides go on.
        began = time.monotonic()
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_TORCHRUN": "stubborn"},
                                        "--rounds", "2", "--budget", "30",
                                        "--least-run-limit", "5")
        took = time.monotonic() - began
        pids = [int(line.split()[1]) for line in log if line.startswith(("torchrun ", "child "))]
        check(rc == 1 and "FAILED torchrun at batch 128, left out after round 0: ran past its" in out
              and "batch  128  resident" in out and len(pids) == 2 and not survivors
              and took < 90,
              "a run that hangs and ignores SIGTERM is ended at its bound, with the session it "
              "started elsewhere, and the others go on", out)

        # resident's run leaves a process running in a session of its own, an orphan
        # once the run ends: the bench, its subreaper, ends it.
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_RESIDENT": "desert:100"},
                                        "--rounds", "1")
        check(rc == 0 and sum(1 for line in log if line.startswith("child ")) == 1
              and not survivors,
              "what a run leaves in a session of its own is ended after it", out)

        # Three sides a round, round 1 in the order torchrun, resident, trainrun:
        # SIGTERM once the fifth run (round 1's resident) began. Round 1 keeps torchrun's.
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_TRAINRUN": "slow:1:100",
                                         "FAKE_TORCHRUN": "slow:1:100",
                                         "FAKE_RESIDENT": "slow:1:100"},
                             "--rounds", "5", signal_after=4)
        last = out.split("stopped by")[-1]
        check(rc == 1 and "stopped by SIGTERM in round 1; its finished runs are kept" in out
              and "1 complete interleaved round(s) of 5" in last
              and re.search(r"batch  128  torchrun .*\(2 rounds\)", last)
              and "trainrun / torchrun = 1.000  (target not assessed: 1 round(s) in common)"
              in last,
              "SIGTERM prints the table of the runs finished", out)

        # Round 0's first run, trainrun's, succeeds and leaves a process that ignores
        # SIGTERM: the bench ends it, SIGKILL 10 s after SIGTERM. A SIGTERM to the
        # bench once the stand-in has exited and been reaped (so during those 10 s)
        # keeps the run's rate, and begins no other run.
        rc, out, log, survivors = bench(repo, tmp, {"FAKE_TRAINRUN": "abandon:100"},
                                        "--rounds", "2", signal_after=1, once_gone="trainrun")
        last = out.split("stopped by")[-1]
        check(rc == 1 and "stopped by SIGTERM in round 0; its finished runs are kept" in out
              and re.search(r"batch  128  trainrun .*\(1 rounds\)", last)
              and not any(line.startswith(("torchrun ", "resident ")) for line in log)
              and not survivors,
              "a stop while a finished run's leftovers are ended keeps its rate", out)


if __name__ == "__main__":
    main()
