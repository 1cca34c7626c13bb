#!/usr/bin/env python3
"""tools/bench/gpu_step.py's own behaviour, with stand-ins for what it runs.

A GPU machine is lent for minutes: the one call that measures on it must yield a
table whatever happens. This runs gpu_step.py against a stand-in trainrun, torchrun
and python (this file, in another role), each told by the environment to succeed with
a rate, fail, take a while or hang, and checks that:
  - the ratios are those of the medians, against the targets;
  - a side that fails is named, left out of the later rounds, and the others go on;
  - --budget begins no round that would not fit, and assesses no target on fewer
    than 3 rounds;
  - a run that hangs is ended at the budget's end, with the processes it started
    (in a session of their own, as torchrun starts its workers), and its round dropped;
  - SIGTERM prints the table of the rounds completed.

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
    """Behaves as `role` (trainrun, torchrun or python) as FAKE_<SIDE> says: "ok:RATE",
    "slow:SECONDS:RATE", "fail" or "hang" (which starts a child in a session of its
    own, as torchrun starts its workers, and ends it on SIGTERM, as torchrun does)."""
    if role == "trainrun":
        side = re.sub(r"\d+-\d+$", "", argv[argv.index("--name") + 1])
    elif role == "torchrun":
        side = "torchrun"
    else:
        side = argv[argv.index("--mode") + 1]
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(f"{side} {os.getpid()}\n")
    how = os.environ.get(f"FAKE_{side.upper()}", "ok:100").split(":")
    if how[0] == "fail":
        print(f"{side}: told to fail", file=sys.stderr)
        sys.exit(3)
    if how[0] == "hang":
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open(os.environ["FAKE_LOG"], "a") as log:
            log.write(f"child {child.pid}\n")

        def end(_signum, _frame):
            child.kill()
            sys.exit(1)
        signal.signal(signal.SIGTERM, end)
        time.sleep(600)
        sys.exit(1)
    if how[0] == "slow":
        time.sleep(float(how[1]))
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


def bench(repo, tmp, env_sides, *args, signal_after=None):
    """Runs gpu_step.py on the CPU at batch 128 (trainrun, torchrun and resident:
    what the targets there compare on a CPU) with the stand-ins; returns its exit
    status, its output and the stand-ins' log."""
    log = os.path.join(tmp, f"log{time.monotonic_ns()}")
    env = dict(os.environ, FAKE_LOG=log)
    env.update(env_sides)
    cmd = [sys.executable, os.path.join(repo, "tools", "bench", "gpu_step.py"), "--device", "cpu",
           "--batch", "128", "--build", tmp, "--torchrun", os.path.join(tmp, "torchrun"),
           "--python", os.path.join(tmp, "python"), *args]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    if signal_after is not None:
        # SIGTERM once the stand-ins' log shows the round it names begun.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if os.path.exists(log) and sum(1 for _ in open(log)) > signal_after:
                process.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
    out, _ = process.communicate(timeout=120)
    lines = open(log).read().split("\n") if os.path.exists(log) else []
    return process.returncode, out, lines


def check(condition, what, out):
    if not condition:
        sys.exit(f"FAILED: {what}\n--- gpu_step.py said:\n{out}")
    print(f"ok: {what}")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is ended: its parent has not reaped it yet.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


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

        rc, out, _ = bench(repo, tmp, {"FAKE_TRAINRUN": "ok:300", "FAKE_TORCHRUN": "ok:100",
                                       "FAKE_RESIDENT": "ok:200"}, "--rounds", "3")
        check(rc == 0 and "3 interleaved round(s) of 3" in out
              and "trainrun / torchrun = 3.000  (target >= 1.3)" in out
              and "trainrun / resident = 1.500  (target >= 1.0)" in out,
              "three rounds give the ratios of the medians against the targets", out)

        rc, out, log = bench(repo, tmp, {"FAKE_TORCHRUN": "fail"}, "--rounds", "3")
        check(rc == 1 and "FAILED torchrun at batch 128, left out after round 0" in out
              and sum(1 for line in log if line.startswith("torchrun ")) == 1
              and "trainrun / resident = 1.000  (target >= 1.0)" in out
              and "trainrun / torchrun" not in out,
              "a side that fails is named and left out, and the others go on", out)

        # How many rounds fit depends on the machine's load: whatever it is, the round
        # after the last one completed is the one not begun.
        rc, out, log = bench(repo, tmp, {"FAKE_TRAINRUN": "slow:2:100"}, "--rounds", "10",
                             "--budget", "6")
        done = re.search(r"round (\d+): not begun", out)
        rounds = int(done.group(1)) if done else -1
        check(rc == 0 and 1 <= rounds < 10 and f"{rounds} interleaved round(s) of 10" in out
              and (rounds >= 3 or f"(target not assessed: {rounds} round(s) in common)" in out),
              "--budget begins no round that would not fit, and under 3 rounds assess no target",
              out)

        began = time.monotonic()
        rc, out, log = bench(repo, tmp, {"FAKE_TORCHRUN": "hang"}, "--rounds", "3",
                             "--budget", "3")
        took = time.monotonic() - began
        pids = [int(line.split()[1]) for line in log if line.startswith(("torchrun ", "child "))]
        check(rc == 1 and "round 0: the budget ran out in torchrun at batch 128" in out
              and "0 interleaved round(s)" in out and len(pids) == 2
              and not any(alive(pid) for pid in pids) and took < 60,
              "a run that hangs ends at the budget's end, with the session it started", out)

        # Three sides a round: SIGTERM once the fifth run (round 1's second) began.
        rc, out, log = bench(repo, tmp, {"FAKE_TRAINRUN": "slow:1:100",
                                         "FAKE_TORCHRUN": "slow:1:100",
                                         "FAKE_RESIDENT": "slow:1:100"},
                             "--rounds", "5", signal_after=4)
        check(rc == 1 and "stopped by SIGTERM in round 1, which is dropped" in out
              and out.rstrip().endswith("(target not assessed: 1 round(s) in common)")
              and "1 interleaved round(s) of 5" in out,
              "SIGTERM prints the table of the rounds completed", out)


if __name__ == "__main__":
    main()
