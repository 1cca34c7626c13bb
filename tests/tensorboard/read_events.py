#!/usr/bin/env python3
"""Reads a run's TensorBoard directory with TensorBoard's own reader, the one
`tensorboard --logdir` uses, and checks that every named tag has the expected
number of steps. Prints one line per tag found; exits 1 saying what is missing,
77 (CTest's skip) when the tensorboard package cannot be imported.

    read_events.py RUN_TB_DIR TAG [TAG ...] --steps N
"""
import argparse
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as error:
    print(f"skipped: cannot import tensorboard ({error}); pip install tensorboard")
    sys.exit(77)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("tags", nargs="+")
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    if not os.path.isdir(args.directory):
        print(f"{args.directory}: no such directory (no TensorBoard events written?)",
              file=sys.stderr)
        return 1

    # 0: keep every scalar; by default the reader samples down to 10,000.
    events = event_accumulator.EventAccumulator(
        args.directory, size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    found = events.Tags()["scalars"]
    problems = []
    for tag in args.tags:
        if tag not in found:
            problems.append(f"tag {tag!r} is missing (found: {sorted(found) or 'none'})")
            continue
        scalars = events.Scalars(tag)
        steps = [s.step for s in scalars]
        print(f"{tag}: {len(scalars)} steps {steps[0]}..{steps[-1]}, last value {scalars[-1].value}")
        if len(scalars) != args.steps:
            # A record with a bad CRC ends the reader's pass silently, so a
            # short count is also how a corrupt file shows.
            problems.append(f"tag {tag!r} has {len(scalars)} steps, expected {args.steps}")
    for problem in problems:
        print(f"{args.directory}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
