#!/usr/bin/env python3
"""Prints the end of each failed test's output from a ctest run's log.

    .ci/failed_tests.py BUILD_DIR [--lines N]

ctest --output-on-failure prints a failed test's output where the test ends,
in the middle of a long run; CI logs are read from their end. This prints, at
the end, the last N lines (60) of every test that did not pass, from
BUILD_DIR/Testing/Temporary/LastTest.log.
"""
import argparse
import pathlib
import re
import sys

START = re.compile(r"^\d+/\d+ Test: (.*)$")


def failed_outputs(log_text):
    """(name, result, output lines) of each test in the log that did not pass."""
    name, lines, status, in_output = None, [], [], False
    for line in log_text.splitlines():
        started = START.match(line)
        if started:
            name, lines, status, in_output = started.group(1), [], [], False
        elif name is None:
            continue
        elif line == "Output:":
            in_output = True
        elif line == "<end of output>":
            in_output = False
        elif in_output:
            lines.append(line)
        elif line.startswith(f'"{name}" end time:'):
            if "Test Passed." not in status:
                yield name, " ".join(status) or "no result", lines
            name = None
        elif line.startswith("Test "):
            status.append(line)  # Test time, Test Failed., Test Fail Reason: ...


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--lines", type=int, default=60)
    args = parser.parse_args()
    log = args.build_dir / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"failed_tests: no {log}")
        return 0
    found = 0
    for name, result, lines in failed_outputs(log.read_text(errors="replace")):
        found += 1
        print(f"===== {name}: {result} (its last {args.lines} lines)")
        for line in lines[-args.lines:]:
            print(line)
    if not found:
        print("failed_tests: no test in the log failed (one that never started is not in it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
