#!/usr/bin/env python3
"""examples/slurm/trainrun.sbatch end to end, on a throwaway single-node Slurm cluster.

    test_slurm.py BUILD_DIR

BUILD_DIR holds trainrun, trainrun-worker, plugins/fashion_mnist/libfashion_mnist.so and
tests/plugins/libtest_plugin.so. Two jobs, each `sbatch --nodes=1 --ntasks-per-node=2`:

- FashionMNIST for a few steps: the job's exit code is 0, and the run directory holds a
  finished run.json for 2 workers, result.jsonl's report and the checkpoint it names;
- the test plugin's `context` entry, which prints what each rank sees: the job's output
  names ranks 0 and 1 of a world of 2.

TRAINRUN_TEST_SLURM_LAUNCH=tasks runs the workers as one `trainrun worker` per Slurm task;
the default is the script's default, one node agent per node. Exit codes: 0 passed,
1 failed, 77 skipped (not root, or Slurm/munge not installed). Loopback traffic only.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import SlurmCluster, free_loopback_port  # noqa: E402

SKIP = 77
REPO = Path(__file__).resolve().parents[2]
SBATCH_SCRIPT = REPO / "examples" / "slurm" / "trainrun.sbatch"
JOB_TIMEOUT_S = 120
ENDED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue",
         "scancel")


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)
    print(f"ok: {message}")


def submit(cluster, work, job_env, name):
    """Runs the example script as one job and returns its output once it ended with code 0."""
    output = work / f"{name}.out"
    command = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", f"--job-name={name}",
               f"--chdir={work}", f"--output={output}", "--time=5", str(SBATCH_SCRIPT)]
    started = time.monotonic()
    sbatch = subprocess.run(command, env=dict(cluster.env, **job_env), cwd=work,
                            capture_output=True, text=True, timeout=30)
    if sbatch.returncode != 0:
        raise Failure(f"sbatch refused job {name}: {sbatch.stderr.strip()}")
    job_id = sbatch.stdout.strip().split(";")[0]
    # Polled here rather than with `sbatch --wait`, whose checks grow up to 32 s apart.
    deadline = started + JOB_TIMEOUT_S
    while (job := job_record(cluster, job_id))["JobState"] not in ENDED_STATES:
        if time.monotonic() > deadline:
            cluster.cancel_jobs()
            raise Failure(f"job {name} still running after {JOB_TIMEOUT_S} s; cancelled\n"
                          f"--- {output}\n{read(output)}")
        time.sleep(0.5)
    text = read(output)
    print(f"job {name} ({job_id}) {job['JobState']} after {time.monotonic() - started:.1f} s, "
          f"exit code {job['ExitCode']}")
    if job["ExitCode"] != "0:0":
        raise Failure(f"job {name} ended with exit code {job['ExitCode']} (status:signal)\n"
                      f"--- {output}\n{text}\n{cluster.log_tail()}")
    print(f"ok: job {name} exited with code 0")
    return text


def job_record(cluster, job_id):
    """scontrol's fields for the job, e.g. {'JobState': 'COMPLETED', 'ExitCode': '0:0'}."""
    line = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], env=cluster.env,
                          capture_output=True, text=True, timeout=10, check=True).stdout
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


@contextlib.contextmanager
def output_on_failure(output):
    """A failed check, or a run directory that is not as expected, shows the job's output."""
    try:
        yield
    except (Failure, OSError, KeyError, ValueError) as error:
        raise Failure(f"{error!r}\n--- the job's output\n{output}") from error


def read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return f"({path} missing)"


def check_fashion_mnist_run(build, run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    check(run["status"] == "finished", f"{run_dir}/run.json: status finished")
    check(run["scaling"]["num_workers"] == 2, "run.json: 2 workers")

    lines = (run_dir / "result.jsonl").read_text().splitlines()
    reports = [json.loads(line) for line in lines]
    check(len(reports) == 1, "result.jsonl: one report (epochs=1)")
    report = reports[0]
    for key in ("iteration", "timestamp", "time_total_s", "metrics", "checkpoint"):
        check(key in report, f"result.jsonl: the report has '{key}'")
    check({"accuracy", "loss", "steps"} <= report["metrics"].keys(),
          "result.jsonl: the metrics have accuracy, loss and steps")
    check(report["metrics"]["steps"] == 10, "result.jsonl: steps=10 (max_steps)")

    checkpoint = run_dir / report["checkpoint"]
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    check(manifest["iteration"] == report["iteration"] and manifest["files"],
          f"{checkpoint.name} is committed: manifest.json with its files")
    state = json.loads((run_dir / "checkpoint_state.json").read_text())
    check(state["latest"] == checkpoint.name, f"checkpoint_state.json: latest is {checkpoint.name}")

    results = subprocess.run([str(build / "trainrun"), "results", str(run_dir)],
                             capture_output=True, text=True, timeout=30)
    check(results.returncode == 0 and re.search(r"status:\s+finished", results.stdout),
          "`trainrun results` says finished")
    check((run_dir / "logs" / "controller.log").is_file(), "logs/controller.log written")


def check_ranks(output, run_dir, launch):
    """The test plugin's `context` line from each rank, as the job's output has it."""
    seen = re.findall(r"context world_rank=(\d+) local_rank=(\d+) node_rank=(\d+) "
                      r"world_size=(\d+) local_world_size=(\d+)", output)
    ranks = sorted(int(rank) for rank, *_ in seen)
    check(ranks == [0, 1], f"the job's output names ranks 0 and 1 (found {ranks})")
    check(all(size == "2" and local_size == "2" for *_, size, local_size in seen),
          "both ranks see world size 2 and local world size 2 (one node)")
    local_ranks = sorted(int(local) for _, local, *_ in seen)
    check(local_ranks == [0, 1], "local ranks 0 and 1")
    threads = re.findall(r"context world_rank=\d+ .* threads=(\d+)", output)
    check(threads == ["1", "1"], "1 intra-op thread per worker (2 CPUs / 2 tasks)")
    if launch == "agent":
        # The agent forwards its workers' output to the controller, which logs it by rank.
        for rank in (0, 1):
            log = run_dir / "logs" / f"worker-{rank}.log"
            check(f"context world_rank={rank} " in read(log),
                  f"logs/{log.name} has rank {rank}'s line")


def run_test(build, launch):
    with SlurmCluster(cpus=max(2, len(os.sched_getaffinity(0)))) as cluster:
        work = Path(cluster.root) / "work"  # removed with the cluster's files
        work.mkdir()
        print(f"slurm cluster up: node {cluster.node}, files in {cluster.root}; launch={launch}")
        common = {
            "TRAINRUN": str(build / "trainrun"),
            "STORAGE_PATH": str(work / "results"),
            "TRAINRUN_LISTEN_ADDR": "127.0.0.1",
            "TRAINRUN_LAUNCH": launch,
            "TRAINRUN_CACHE_DIR": str(work / "cache"),  # workers' plugin cache
            "TRAINRUN_ARGS": "--startup-timeout 60 --heartbeat-timeout 15",
            "TRAINRUN_GRACE_S": "20",  # past the heartbeat timeout
        }

        fashion = dict(common, PLUGIN=str(build / "plugins/fashion_mnist/libfashion_mnist.so"),
                       CONFIG="epochs=1 max_steps=10 eval_steps=2 log_every=5",
                       RUN_NAME="fashion", TRAINRUN_PORT=str(free_loopback_port()))
        output = submit(cluster, work, fashion, "fashion")
        with output_on_failure(output):
            check_fashion_mnist_run(build, work / "results" / "fashion")
            check(not list(work.glob(".trainrun-*")), "the job's key directory is removed")

        context = dict(common, PLUGIN=str(build / "tests/plugins/libtest_plugin.so"),
                       ENTRY="context", CONFIG="reports=1", RUN_NAME="context",
                       TRAINRUN_PORT=str(free_loopback_port()))
        output = submit(cluster, work, context, "context")
        with output_on_failure(output):
            check_ranks(output, work / "results" / "context", launch)


def main():
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("SKIP: needs root (it starts munged, slurmctld and slurmd)")
        return SKIP
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        print(f"SKIP: not installed: {' '.join(missing)} (Debian: slurm-wlm, munge)")
        return SKIP

    build = Path(sys.argv[1]).resolve()
    needed = ["trainrun", "trainrun-worker", "plugins/fashion_mnist/libfashion_mnist.so",
              "tests/plugins/libtest_plugin.so"]
    absent = [name for name in needed if not (build / name).exists()]
    if absent:
        print(f"FAIL: {build} lacks {', '.join(absent)}")
        return 1

    launch = os.environ.get("TRAINRUN_TEST_SLURM_LAUNCH", "agent")
    started = time.monotonic()
    try:
        run_test(build, launch)
    except (Failure, subprocess.SubprocessError, OSError, RuntimeError) as failure:
        # RuntimeError covers a cluster that did not come up (TimeoutError is an OSError).
        print(f"FAIL: {failure}")
        return 1
    print(f"PASS in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
