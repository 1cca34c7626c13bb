#!/usr/bin/env python3
"""Every binary that links LibTorch loads libstdc++ before it.

pip's libtorch.so (2.11, for one) exports its own unversioned copy of
std::filesystem; the loader binds a call to the first definition in load order,
and LibTorch's remove_all crashed every worker of a run at its first
train::TempDir. cmake/TrainrunPlugin.cmake links libstdc++ ahead of everything:
this checks, with readelf, that the first of libstdc++.so.6 and LibTorch's
libraries among each binary's DT_NEEDED is libstdc++.so.6.

  test_libstdcxx_first.py BINARY...
"""
import re
import subprocess
import sys


def needed(path):
    out = subprocess.run(["readelf", "-d", path], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


failed = []
for binary in sys.argv[1:]:
    names = [n for n in needed(binary) if n.startswith(("libstdc++.so", "libtorch", "libc10"))]
    if not names:
        failed.append(f"{binary} needs neither libstdc++ nor LibTorch")
    elif not names[0].startswith("libstdc++.so"):
        failed.append(f"{binary} loads {names[0]} before libstdc++: {', '.join(names)}")
    else:
        print(f"ok: {binary}: {', '.join(names[:3])}, ...")
if failed:
    sys.exit("\n".join(failed))
