#!/usr/bin/env python3
"""PyTorch as a standing oracle for trainrun's DDP and sampler (a ctest).

For every scenario of ddp_oracle.py, on 2 and on 3 ranks: the same model,
data and seeds through trainrun (tests/plugins/oracle_plugin.cpp), through
PyTorch's DistributedDataParallel of this LibTorch line and through one
process; ddp_oracle.py compare then checks trainrun against DDP where DDP is
right and against the one process where it is not. Then trainrun's
DistributedSampler against PyTorch's, on 3 ranks.

Usage: test_oracle.py TRAINRUN ORACLE_PLUGIN DDP_PLUGIN PYTHON TORCH_VERSION
PYTHON must have this line's PyTorch; without it the test skips (exit 77),
saying why.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORACLE = HERE / "ddp_oracle.py"
SKIP = 77


def run(args, timeout=300):
    """Runs a command; returns its output, or raises with it."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {done.returncode}:\n"
                           f"{done.stdout}\n{done.stderr}")
    return done.stdout


def torch_line(python):
    """major.minor of the torch that `python` imports, or None."""
    try:
        out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return ".".join(out.stdout.strip().split(".")[:2])


def check_ddp(trainrun, plugin, python, root):
    """Every scenario on 2 and 3 ranks: prepared, trained by trainrun, by DDP and by
    one process, then compared; the names of those that failed."""
    started = time.monotonic()
    cases = [Path(line) for line in run([python, ORACLE, "prepare", "--out", root]).split()]
    for case in cases:
        world = json.loads((case / "scenario.json").read_text())["world"]
        run([trainrun, "--plugin", plugin, "--entry", "oracle", "-n", world,
             "--name", case.name, "--storage-path", root / "runs",
             "--config", f"dir={case}", "--config", f"out={case}/trainrun_rank"])
    trained = time.monotonic()
    dirs = [arg for case in cases for arg in ("--dir", case)]
    print(run([python, ORACLE, "pytorch", *dirs], timeout=900).rstrip(), flush=True)
    compared = subprocess.run([python, ORACLE, "compare", *map(str, dirs),
                               "--trainrun-prefix", "trainrun_rank"],
                              capture_output=True, text=True, timeout=300)
    print(compared.stdout.rstrip(), compared.stderr.rstrip(), sep="\n", flush=True)
    print(f"{len(cases)} cases: trainrun {trained - started:.1f} s, PyTorch and comparison "
          f"{time.monotonic() - trained:.1f} s", flush=True)
    failed = [line.split(":")[0] for line in compared.stdout.splitlines()
              if line.startswith("FAIL")]
    if compared.returncode != 0 and not failed:
        failed = ["compare exited " + str(compared.returncode)]
    return sorted(set(failed))


def read_trainrun_indices(directory, world):
    """{"<size>/<shuffle>/<drop_last>/<epoch>/<rank>": [...]} from the plugin's files."""
    indices = {}
    for rank in range(world):
        for line in (directory / f"rank{rank}.txt").read_text().splitlines():
            key, _, values = line.partition(":")
            size, shuffle, duplicates, epoch, r = key.split("/")
            flag = lambda b: "true" if b else "false"
            name = f"{size}/{flag(shuffle == '1')}/{flag(duplicates == '0')}/{epoch}/{r}"
            indices[name] = [int(v) for v in values.split()]
    return indices


def check_sampler(trainrun, ddp_plugin, python, root):
    """trainrun's sampler on 3 ranks against torch's DistributedSampler."""
    world = 3
    out = root / "sampler"
    out.mkdir()
    run([trainrun, "--plugin", ddp_plugin, "--entry", "sampler_indices", "-n", world,
         "--name", "sampler", "--storage-path", root / "runs", "--config", f"out={out}"])
    ours = read_trainrun_indices(out, world)
    run([python, ORACLE, "sampler", "--torch-json", out / "torch.json"])
    theirs = json.loads((out / "torch.json").read_text())
    failures = []
    for size in (10, 101, 1000):
        for shuffle in ("true", "false"):
            for drop_last in ("true", "false"):
                kept_sets, repeated_sets = set(), set()
                for epoch in range(4):
                    keys = [f"{size}/{shuffle}/{drop_last}/{epoch}/{r}" for r in range(world)]
                    case = f"size {size}, shuffle {shuffle}, drop_last {drop_last}, epoch {epoch}"
                    mine = [ours[k] for k in keys]
                    torch_lists = [theirs[k] for k in keys]
                    if shuffle == "true" and mine != torch_lists:
                        failures.append(f"{case}: other indices than DistributedSampler's")
                    # Coverage and balance: the same samples, as often, as PyTorch;
                    # every rank the same count.
                    every = sorted(i for m in mine for i in m)
                    if every != sorted(i for t in torch_lists for i in t):
                        failures.append(f"{case}: other samples than DistributedSampler's")
                    if len({len(m) for m in mine}) != 1:
                        failures.append(f"{case}: ranks get {[len(m) for m in mine]} samples")
                    kept_sets.add(frozenset(every))
                    repeated_sets.add(frozenset(i for i in every if every.count(i) > 1))
                # Shuffled: what is left out, or repeated, changes with the epoch.
                uneven = size % world != 0
                if shuffle == "true" and uneven and drop_last == "true" and len(kept_sets) == 1:
                    failures.append(f"size {size}, shuffled: the same samples left out every epoch")
                if shuffle == "true" and uneven and drop_last == "false" and len(repeated_sets) == 1:
                    failures.append(f"size {size}, shuffled: the same samples repeated every epoch")
    print(f"sampler on {world} ranks: {'ok' if not failures else 'FAILED'}", flush=True)
    return failures


def main():
    trainrun, plugin, ddp_plugin, python, torch_version = sys.argv[1:6]
    line = ".".join(torch_version.split(".")[:2])
    found = torch_line(python)
    if found != line:
        print(f"SKIPPED: {python} has no PyTorch {line} (it has {found or 'none'}); "
              "install python3-torch (1.13) or run tools/setup_torch2.sh (2.x)")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="trainrun-oracle-") as tmp:
        root = Path(tmp)
        failures = check_ddp(trainrun, plugin, python, root)
        failures += check_sampler(trainrun, ddp_plugin, python, root)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
