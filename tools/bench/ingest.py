#!/usr/bin/env python3
"""Images into training batches: trainrun's loader against PyTorch's, DALI's and Ray Data's.

The same photographs (--images of ImageNet's size, tools/bench/make_photos.py,
in 8 WebDataset shards made in a temporary directory, or those of --shards DIR)
go through the same pipeline in each: JPEG decode, RandomResizedCrop to 224x224
(scale 0.08-1, ratio 3/4-4/3), a random horizontal flip, ImageNet's mean and
standard deviation into float32 CHW, batches of 256, on 2 cores:
  trainrun  BUILD/tests/ingest_bench trainrun (the SDK's loader, 2 threads)
  torch     DataLoader, 2 workers, over webdataset with torchvision's transforms
  dali      NVIDIA DALI's pipeline on the CPU, 2 threads
  ray       Ray Data on a local Ray of 2 CPUs, torchvision's transforms
  ceiling   BUILD/tests/ingest_bench ceiling: libjpeg-turbo decoding the same
            JPEGs whole on one thread, nothing else
(tools/bench/ingest_baselines.py says how each baseline is built.) Each runs as
a process of its own, pinned to --cores CPUs, once a round in turn for --rounds
rounds, and gives: images/s from its own timer (after its start-up), the run's
wall time with its start-up, images per CPU-second of its whole process tree
(start-up included; os.wait4's rusage of the process and all that it reaped, so
DataLoader's workers; for ray, whose raylet and workers the driver does not
reap, /proc's figures for its whole tree read just before ray.shutdown()), the
baselines' images per CPU-second of their loop alone (their start-up left out),
the time to the first batch, and the peak of the tree's proportional set size
(PSS, /proc/PID/smaps_rollup summed over the tree every 0.1 s, or less often
where reading it costs more than 2% of a core; shared pages counted once), with
the largest process's max RSS (rusage).
Prints the medians and the ratios of images per CPU-second: trainrun / torch
(target >= 2.5), trainrun / dali (target >= 1.2), trainrun / ray, and
trainrun / ceiling (target >= 0.7: trainrun's whole pipeline against bare
decoding, per core); and, more sparing to the baselines, trainrun's against
their loop alone.

Run it with the baselines' Python (tools/setup_ingest.sh); a contender whose
binary or environment is missing shows as skipped, saying why:
  /opt/trainrun-ingest/bin/python tools/bench/ingest.py [--build build] [--images 5120]
      [--rounds 3] [--shards DIR] [--contenders trainrun,torch,dali,ray,ceiling]
      [--json FILE] [--timeout 600] [--cores 2]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ingest_baselines import tree  # noqa: E402

CONTENDERS = ["trainrun", "torch", "dali", "ray", "ceiling"]
VENV = os.environ.get("TRAINRUN_INGEST_VENV", "/opt/trainrun-ingest")
SHARDS = 8  # an even count, so DataLoader's 2 workers read as many images each
SAMPLE_S = 0.1  # at least; each sample waits 50 times the CPU time of the last one
TARGETS = {"torch": 2.5, "dali": 1.2, "ray": None, "ceiling": 0.7}


def tree_pss(root):
    """Bytes of `root`'s tree, each process's proportional set size."""
    total = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def measure(name, cmd, env, timeout_s):
    """Runs `cmd` in a session of its own; returns its result, or a reason it gave none."""
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, to=to: to.extend(s), daemon=True)
               for s, to in ((proc.stdout, out), (proc.stderr, err))]
    peak = [0]
    done = threading.Event()
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def sample():  # smaps_rollup of Ray's dozen processes takes ~50 ms of CPU to read
        wait_s = SAMPLE_S
        while not done.wait(wait_s):
            cpu = time.thread_time()
            peak[0] = max(peak[0], tree_pss(proc.pid))
            wait_s = max(SAMPLE_S, 50 * (time.thread_time() - cpu))

    sampler = threading.Thread(target=sample, daemon=True)
    timer = threading.Timer(timeout_s, kill)
    for thread in readers + [sampler, timer]:
        thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    timer.cancel()
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything of it still running
    except ProcessLookupError:
        pass
    for thread in readers + [sampler]:
        thread.join()
    lines = [line for line in out if line.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    if "unavailable" in result:
        return result
    if proc.returncode != 0 or not {"images", "seconds", "first_batch_s"} <= result.keys():
        why = (f"timed out after {timeout_s:.0f} s" if timed_out.is_set() else
               f"exited {proc.returncode}" if proc.returncode != 0 else
               "printed no JSON line of images, seconds and first_batch_s")
        tail = [line.rstrip() for line in (err + out)[-5:]]
        return {"failed": f"{why}: " + " | ".join(tail)}
    result["wall_s"] = wall
    result["peak_pss_mib"] = peak[0] / 2**20
    result["max_rss_mib"] = usage.ru_maxrss / 1024
    if "tree_cpu_s" in result:
        result["cpu_s"] = result["tree_cpu_s"]
        result["cpu_from"] = "/proc, whole tree"
    else:
        result["cpu_s"] = usage.ru_utime + usage.ru_stime
        result["cpu_from"] = "wait4"
    result["images_per_s"] = result["images"] / result["seconds"]
    result["images_per_cpu_s"] = result["images"] / result["cpu_s"]
    if "loop_cpu_s" not in result and name == "ceiling":
        result["loop_cpu_s"] = result["seconds"]  # one thread, busy all its timer
    if result.get("loop_cpu_s"):
        result["loop_images_per_cpu_s"] = result["images"] / result["loop_cpu_s"]
    return result


def commands(args, shards):
    """{contender: (command, environment) or the reason it cannot run}."""
    bench = os.path.join(args.build, "tests", "ingest_bench")
    python = os.path.join(VENV, "bin", "python")
    spec = os.path.join(shards, "train-*.tar")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    found = {}
    for name in args.contenders:
        if name in ("trainrun", "ceiling"):
            if not os.access(bench, os.X_OK):
                found[name] = f"{bench} is not built (cmake --build {args.build} " \
                              "--target ingest_bench)"
                continue
            cmd = [bench, name, "--shards", spec, "--images", str(args.images)]
            if name == "trainrun":
                cmd += ["--batch", "256", "--threads", str(len(args.cores))]
        else:
            if not os.access(python, os.X_OK):
                found[name] = f"no {python} (tools/setup_ingest.sh makes it)"
                continue
            cmd = [python, os.path.join(HERE, "ingest_baselines.py"), name, "--shards", shards,
                   "--images", str(args.images), "--batch", "256",
                   "--threads", str(len(args.cores))]
        found[name] = (cmd, env)
    return found


def make_shards(images, directory):
    subprocess.run([sys.executable, os.path.join(HERE, "make_photos.py"), directory,
                    "--images", str(images), "--per-shard", str(-(-images // SHARDS))],
                   check=True, timeout=1800)


MEDIANS = ["images_per_s", "wall_s", "images_per_cpu_s", "loop_images_per_cpu_s",
           "first_batch_s", "peak_pss_mib", "max_rss_mib", "images", "seconds", "cpu_s"]


def summarise(results):
    """{contender: medians of its rounds, or why it has none}."""
    summary = {}
    for name, runs in results.items():
        if isinstance(runs, str):
            summary[name] = {"skipped": runs}
            continue
        good = [run for run in runs if "images" in run]
        if not good:
            summary[name] = {"skipped": "every round failed; the last " + runs[-1]["failed"]}
            continue
        summary[name] = {key: statistics.median([run[key] for run in good])
                         for key in MEDIANS if key in good[0]}
        summary[name]["cpu_from"] = good[0]["cpu_from"]
        summary[name]["runs"] = good
        if len(good) < len(runs):
            summary[name]["failures"] = [run["failed"] for run in runs if "failed" in run]
    return summary


def ratios(summary):
    """trainrun's images per CPU-second over each other contender's: with their
    start-up, and their loops alone (trainrun's with its start-up where its
    binary does not give its loop's CPU time)."""
    found = {}
    ours = summary.get("trainrun", {})
    ours_loop = ours.get("loop_images_per_cpu_s") or ours.get("images_per_cpu_s")
    for name, target in TARGETS.items():
        theirs = summary.get(name, {})
        whole, loop = theirs.get("images_per_cpu_s"), theirs.get("loop_images_per_cpu_s")
        found[name] = {
            "ratio": ours["images_per_cpu_s"] / whole if ours_loop and whole else None,
            "loops_alone": ours_loop / loop if ours_loop and loop else None,
            "target": target,
        }
    return found


def show(summary, found, args):
    print(f"{args.images} images of ImageNet's size, batches of 256, {len(args.cores)} cores "
          f"(CPUs {','.join(map(str, args.cores))}), {args.rounds} rounds, medians:")
    print(f"  {'':9} {'images/s':>9} {'wall s':>7} {'img/CPU-s':>9} {'loop alone':>10} "
          f"{'1st batch s':>11} {'peak PSS MiB':>12} {'max RSS MiB':>11}  CPU from")
    for name in args.contenders:
        row = summary[name]
        if "skipped" in row:
            print(f"  {name:9} skipped: {row['skipped']}")
            continue
        loop = row.get("loop_images_per_cpu_s")
        first = f"{row['first_batch_s']:.2f}" if row["first_batch_s"] else "-"
        print(f"  {name:9} {row['images_per_s']:9.0f} {row['wall_s']:7.1f} "
              f"{row['images_per_cpu_s']:9.0f} {f'{loop:.0f}' if loop else '-':>10} "
              f"{first:>11} {row['peak_pss_mib']:12.0f} "
              f"{row['max_rss_mib']:11.0f}  {row['cpu_from']}")
        for failure in row.get("failures", []):
            print(f"  {'':9} a round failed: {failure}")
    print("trainrun's images per CPU-second over theirs, with start-up; loops alone:")
    for name, entry in found.items():
        if name not in args.contenders or name == "trainrun":
            continue
        target = f" (target >= {entry['target']})" if entry["target"] else ""
        whole, loop = entry["ratio"], entry["loops_alone"]
        print(f"  {name:9} {f'{whole:.2f}' if whole else 'n/a'}; "
              f"{f'{loop:.2f}' if loop else 'n/a'}{target}")
    ours = summary.get("trainrun", {})
    if "images_per_cpu_s" in ours and "loop_images_per_cpu_s" not in ours:
        print("  (ingest_bench trainrun gives no loop_cpu_s: its rate with start-up stands "
              "for its loop's)")
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--images", type=int, default=5120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", help="a directory of train-*.tar (default: made here)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", help="write the medians and ratios to this file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each run")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    args.contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        sys.exit(f"unknown contenders {sorted(unknown)}; they are {','.join(CONTENDERS)}")
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < args.cores:
        sys.exit(f"--cores {args.cores}, but this process may use {len(allowed)} CPUs")
    args.cores = allowed[:args.cores]
    os.sched_setaffinity(0, args.cores)  # and so every contender's processes
    tmp = None
    try:
        if args.shards:
            shards = args.shards
        else:
            tmp = tempfile.mkdtemp(prefix="trainrun-ingest-bench-")
            shards = os.path.join(tmp, "shards")
            make_shards(args.images, shards)
        runnable = commands(args, shards)
        results = {name: entry if isinstance(entry, str) else []
                   for name, entry in runnable.items()}
        for r in range(args.rounds):
            order = args.contenders[r % len(args.contenders):] + \
                args.contenders[:r % len(args.contenders)]
            for name in order:
                if isinstance(results[name], str):
                    continue
                cmd, env = runnable[name]
                result = measure(name, cmd, env, args.timeout)
                results[name].append(result)
                if "unavailable" in result:
                    results[name] = result["unavailable"]
                print(f"round {r + 1} {name}: " + (
                    f"{result['images_per_s']:.0f} images/s, "
                    f"{result['images_per_cpu_s']:.0f} images/CPU-s"
                    if "images" in result else
                    result.get("unavailable") or result["failed"]), flush=True)
        summary = summarise(results)
        found = ratios(summary)
        show(summary, found, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"images": args.images, "rounds": args.rounds, "cores": args.cores,
                           "contenders": summary, "ratios": found}, f, indent=1)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
