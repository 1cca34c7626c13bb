#!/usr/bin/env python3
"""Reads a log on stdin and writes it back with each frame that
tools/gpu/backtrace.c printed ("/path/libx.so(+0x1234)[0x7f...]") resolved by
addr2line to its function and line (one addr2line per file), and named frames
("/path/libx.so(symbol+0x12)[...]") demangled.

  tools/gpu/symbolize.py < log
"""
import collections
import re
import subprocess
import sys

FRAME = re.compile(r"(?P<file>/[^\s(]+)\((?P<symbol>[^)+]*)\+(?P<offset>0x[0-9a-f]+)\)\s*\[")


def run(command, text_in=None):
    try:
        return subprocess.run(command, input=text_in, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


lines = sys.stdin.readlines()
wanted = collections.defaultdict(set)
for line in lines:
    match = FRAME.search(line)
    if match and not match["symbol"]:
        wanted[match["file"]].add(match["offset"])

resolved = {}
for path, offsets in wanted.items():
    offsets = sorted(offsets)
    # A return address points after its call: look one byte back.
    query = "\n".join(hex(max(int(o, 16) - 1, 0)) for o in offsets) + "\n"
    out = run(["addr2line", "-f", "-C", "-e", path], query).splitlines()
    for i, offset in enumerate(offsets):
        pair = out[2 * i:2 * i + 2]
        resolved[(path, offset)] = " | ".join(pair) if pair else ""

for line in lines:
    match = FRAME.search(line)
    if match:
        if match["symbol"]:
            where = run(["c++filt", match["symbol"]]).strip()
        else:
            where = resolved.get((match["file"], match["offset"]), "")
        line = line.rstrip("\n") + "   => " + where + "\n"
    sys.stdout.write(line)
