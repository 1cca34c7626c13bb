#!/usr/bin/env python3
"""The README's tour (examples/tour) as a reader runs it: a run of 2 workers,
then the same run name again with more steps. The rerun must resume from the
first run's latest checkpoint: its records go on from the first run's last
step, with the iteration counting on, and rank 0 reads the step it saved.

usage: test_tour.py TRAINRUN PLUGIN
"""
import json
import os
import subprocess
import sys
import tempfile

FIRST_STEPS, MORE_STEPS = 5, 8


def run(trainrun, plugin, storage, steps):
    out = subprocess.run([trainrun, "--plugin", plugin, "--num-workers", "2", "--storage-path",
                          storage, "--name", "demo", "--config", f"steps={steps}"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"trainrun with steps={steps} exited {out.returncode}:\n{out.stdout[-3000:]}")
    return out.stdout


def records(storage):
    with open(os.path.join(storage, "demo", "result.jsonl")) as f:
        return [json.loads(line) for line in f if '"metrics"' in line]


def main():
    trainrun, plugin = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as storage:
        run(trainrun, plugin, storage, FIRST_STEPS)
        first = records(storage)
        steps = [r["metrics"]["step"] for r in first]
        if steps != list(range(FIRST_STEPS)):
            sys.exit(f"the first run reported steps {steps}, not 0..{FIRST_STEPS - 1}")
        latest = os.path.join(storage, "demo", f"checkpoint_{FIRST_STEPS - 1:06d}", "step.txt")
        with open(latest) as f:
            if f.read().strip() != str(FIRST_STEPS - 1):
                sys.exit(f"{latest} does not hold step {FIRST_STEPS - 1}")
        output = run(trainrun, plugin, storage, MORE_STEPS)
        both = records(storage)
        steps = [r["metrics"]["step"] for r in both]
        if steps != list(range(MORE_STEPS)):
            sys.exit(f"after the rerun the steps are {steps}, not 0..{MORE_STEPS - 1}: the rerun "
                     f"did not go on from step {FIRST_STEPS}\n{output[-3000:]}")
        iterations = [r["iteration"] for r in both]
        if iterations != sorted(set(iterations)) or len(iterations) != MORE_STEPS:
            sys.exit(f"the iterations do not count on across the rerun: {iterations}")
        losses = [r["metrics"]["loss"] for r in both]
        if not losses[-1] < losses[0]:
            sys.exit(f"the loss did not fall: {losses}")
    print(f"tour: {FIRST_STEPS} steps, rerun to {MORE_STEPS}, resumed at step {FIRST_STEPS}")


if __name__ == "__main__":
    main()
