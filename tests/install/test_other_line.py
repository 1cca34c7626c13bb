#!/usr/bin/env python3
"""A plugin built against the other LibTorch line is refused before any worker
starts: exit code 2, one line naming both LibTorch versions, nothing written.

  test_other_line.py TRAINRUN OTHER_PLUGIN THIS_TORCH_VERSION

Exits 77 (skipped) when no other line's plugin is given: CI builds both lines
and passes one build's plugin to the other (TRAINRUN_OTHER_LINE_PLUGIN).
"""
import os
import re
import subprocess
import sys
import tempfile


def main():
    trainrun, other, mine = sys.argv[1:4]
    if not other:
        print("skipped: no plugin of the other LibTorch line was given "
              "(configure with -DTRAINRUN_OTHER_LINE_PLUGIN=PATH)")
        return 77
    if not os.path.exists(other):
        print(f"the other line's plugin {other} does not exist")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        storage = os.path.join(tmp, "results")
        result = subprocess.run(
            [trainrun, "--plugin", other, "-n", "2", "--storage-path", storage, "--name", "x"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
            env=dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache")))
        output = result.stdout
        print(output, end="")
        match = re.search(r"was built with LibTorch (\S+), this trainrun uses (\S+): "
                          r"rebuild the plugin against the same LibTorch", output)
        failures = []
        if result.returncode != 2:
            failures.append(f"exit code {result.returncode}, expected 2")
        if output.count("\n") != 1:
            failures.append("expected exactly one line")
        if not match:
            failures.append("no line naming both LibTorch versions")
        elif match.group(2) != mine or match.group(1) == mine:
            failures.append(f"versions named: {match.group(1)} and {match.group(2)}; "
                            f"this build's is {mine}")
        if os.path.exists(os.path.join(storage, "x")):
            failures.append("a run directory was written")
        for failure in failures:
            print("FAILED:", failure)
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
