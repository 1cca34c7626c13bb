#!/usr/bin/env python3
"""Oracle for trainrun's data-parallel training: what PyTorch's own DDP does.

Small models are trained through torch.nn.parallel.DistributedDataParallel
(gloo, CPU, W processes on 127.0.0.1) and through one process that sees the
whole batch; both results are written as JSON and compared with what trainrun
produced from the same inputs (trainrun's side is a C++ plugin that reads
scenario.json, init.json and data.json and writes one state file per rank).

Commands (the directories of one scenario each; several at once share one
torch import per process, and one DDP process group per world size):
  prepare  --out ROOT [--scenario NAME]... [--world W]...
                               ROOT/<scenario>-<W>/: scenario.json, init.json, data.json
                               (every scenario on 2 and 3 ranks by default)
  pytorch  --dir DIR...        DIR/ddp_rank{r}.json, DIR/single.json, DIR/pytorch.json
                               (torch version, DDP ok or why not)
  compare  --dir DIR... --trainrun-prefix PREFIX
                               checks PREFIX{r}.json (a bare PREFIX: inside each DIR);
                               exit 1 on any failure
  sampler  --torch-json FILE   what DistributedSampler yields, keyed
                               "<size>/<shuffle>/<drop_last>/<epoch>/<rank>"
                               (booleans as "true"/"false")

compare checks that trainrun's ranks agree bit for bit; that rank 0 matches
DDP's rank 0 (params, grads, buffers) wherever DDP is right, i.e. its ranks
agree and it matches the one-process run, and always for bn_* (BatchNorm
statistics are per rank in DDP, so one process has other ones); and that it
matches the one-process run (params, grads) for every scenario but bn_*.
Where DDP is wrong it says so in "note" lines without failing.

A state file is {"params": {name: T|null}, "grads": {name: T|null},
"buffers": {name: T}} with T = {"shape": [...], "values": [...row-major...]};
null is an undefined tensor (a .grad that is None).

Runs under any Python 3.11 with torch (1.13 or 2.x); standard library and
torch only, no numpy.
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------
# Scenarios

SGD = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
ADAM = {"optimizer": "adam", "lr": 0.01, "momentum": 0.0, "weight_decay": 0.1}
DEFAULTS = {"micro": 1, "batch": 12, "find_unused": False, "compression": "none"}

SCENARIOS = {
    "bn_sgd": {"model": "mlp_bn", "steps": 5, **SGD},
    "bn_adam": {"model": "mlp_bn", "steps": 5, **ADAM},
    "frozen_sgd": {"model": "frozen", "steps": 5, **SGD},
    "unused_adam": {"model": "unused", "steps": 6, "find_unused": True, **ADAM},
    "sometimes_adam": {"model": "sometimes", "steps": 6, "find_unused": True, **ADAM},
    "sometimes_sgd": {"model": "sometimes", "steps": 6, "find_unused": True, **SGD},
    "accumulate_sgd": {"model": "sometimes", "steps": 4, "micro": 3, "find_unused": True, **SGD},
    "accumulate_adam": {"model": "sometimes", "steps": 4, "micro": 3, "find_unused": True, **ADAM},
    "bf16_sgd": {"model": "sometimes", "steps": 5, "compression": "bf16", **SGD},
    # bf16 over Gloo (alltoall, then allgather) with the used map between them.
    "sometimes_bf16": {"model": "sometimes", "steps": 6, "find_unused": True,
                       "compression": "bf16", **SGD},
}

# ---------------------------------------------------------------------------
# Tolerances: a value b passes against reference a when |a - b| <= atol + rtol * |a|.

EXACT = (0.0, 0.0)
VS_DDP_SGD_MANY_RANKS = (5e-7, 0.0)     # W >= 3: the sum of three is order-dependent
VS_DDP_ADAM_MANY_RANKS = (5e-7, 1e-5)   # Adam divides by sqrt(v): last-bit noise grows
VS_DDP_BUFFERS_MANY_RANKS = (5e-7, 0.0)
VS_SINGLE = (1e-5, 1e-4)                # one process sums in another order
BF16 = (2e-2, 0.0)                      # gradients travel as bfloat16

DDP_TIMEOUT_S = 120  # a DDP run's bound: this, and 30 s more per scenario
DDP_TIMEOUT_PER_SCENARIO_S = 30


def scenario_config(name, world):
    """scenario.json's contents, in its key order (batch 12 divides among 2 or 3 ranks)."""
    config = {"scenario": name, "world": world, **DEFAULTS, **SCENARIOS[name]}
    keys = ["scenario", "world", "steps", "micro", "batch", "optimizer", "lr", "momentum",
            "weight_decay", "find_unused", "compression", "model"]
    return {key: config[key] for key in keys}


def uses_branch(config, rank, step, micro):
    """Whether the `sometimes` model takes its branch on this rank, step and micro-batch."""
    name = config["scenario"]
    if name.startswith("sometimes_"):
        return (step + rank) % 3 == 0
    if name.startswith("accumulate_"):
        return micro < config["micro"] - 1
    return name == "bf16_sgd"


def scenario_seed(name):
    return zlib.crc32(name.encode())

# ---------------------------------------------------------------------------
# Models (module names and registration order are mirrored by trainrun's plugin)


class MlpBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x, use_branch=False):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc1.requires_grad_(False)
        self.fc2 = nn.Linear(16, 4, bias=False)

    def forward(self, x, use_branch=False):
        return self.fc2(torch.tanh(self.fc1(x)))


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 4)

    def forward(self, x, use_branch=False):
        return self.fc2(torch.tanh(self.fc1(x)))


class Sometimes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.branch = nn.Linear(16, 4)

    def forward(self, x, use_branch=False):
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h)
        if use_branch:
            out = out + self.branch(h)
        return out


MODELS = {"mlp_bn": MlpBn, "frozen": Frozen, "unused": Unused, "sometimes": Sometimes}


def make_optimizer(config, model):
    if config["optimizer"] == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"],
                               weight_decay=config["weight_decay"])
    return LibTorchAdam(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])


class LibTorchAdam(torch.optim.Optimizer):
    """Adam as LibTorch's C++ torch::optim::Adam computes it, op for op (PyTorch 2.x's
    Python Adam uses lerp_, which rounds differently): the oracle compares what DDP
    does to gradients, not two implementations of Adam."""

    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                grad = p.grad
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(
                    group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / bias_correction1)

# ---------------------------------------------------------------------------
# JSON tensors and state files


def tensor_to_json(t):
    return {"shape": list(t.shape), "values": [float(v) for v in t.detach().reshape(-1).tolist()]}


def tensor_from_json(obj, dtype=torch.float32):
    return torch.tensor(obj["values"], dtype=dtype).reshape(obj["shape"])


def model_state(model):
    params = dict(model.named_parameters())
    return {
        "params": {n: tensor_to_json(p) for n, p in params.items()},
        "grads": {n: None if p.grad is None else tensor_to_json(p.grad) for n, p in params.items()},
        "buffers": {n: tensor_to_json(b) for n, b in model.named_buffers()},
    }


def load_model_state(model, state):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensor_from_json(state["params"][name]))
        for name, b in model.named_buffers():
            b.copy_(tensor_from_json(state["buffers"][name]))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def build_model(directory, config):
    model = MODELS[config["model"]]()
    load_model_state(model, read_json(directory / "init.json"))
    model.train()
    return model


def batch_rows(data, index, rank, world):
    """Rank's slice of global batch `index` (step * micro + micro_index)."""
    x = tensor_from_json(data["x"][index])
    y = tensor_from_json(data["y"][index])
    rows = x.shape[0] // world
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]

# ---------------------------------------------------------------------------
# prepare


def cmd_prepare(args):
    for name in args.scenario or sorted(SCENARIOS):
        for world in args.world or (2, 3):
            out = Path(args.out) / f"{name}-{world}"
            prepare(name, world, out)
            print(out)


def prepare(name, world, out):
    config = scenario_config(name, world)
    out.mkdir(parents=True, exist_ok=True)
    seed = scenario_seed(name)
    torch.manual_seed(seed)
    model = MODELS[config["model"]]()
    generator = torch.Generator().manual_seed(seed + 1)
    count = config["steps"] * config["micro"]
    batch = config["batch"]
    data = {
        "x": [tensor_to_json(torch.randn(batch, 8, generator=generator)) for _ in range(count)],
        "y": [tensor_to_json(torch.randn(batch, 4, generator=generator)) for _ in range(count)],
    }
    write_json(out / "scenario.json", config)
    write_json(out / "init.json", model_state(model))
    write_json(out / "data.json", data)

# ---------------------------------------------------------------------------
# pytorch: the DDP run (one subprocess per rank) and the one-process run


def train_ddp(directory, config, rank):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    data = read_json(directory / "data.json")
    model = build_model(directory, config)
    ddp = DistributedDataParallel(model, find_unused_parameters=config["find_unused"])
    if config["compression"] == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    optimizer = make_optimizer(config, model)
    micro = config["micro"]
    for step in range(config["steps"]):
        optimizer.zero_grad()
        for m in range(micro):
            x, y = batch_rows(data, step * micro + m, rank, config["world"])
            sync = contextlib.nullcontext() if m == micro - 1 else ddp.no_sync()
            with sync:
                F.mse_loss(ddp(x, uses_branch(config, rank, step, m)), y).backward()
        optimizer.step()
    dist.barrier()
    return model


def cmd_ddp_worker(args):
    """One DDP rank: every directory in turn, in one process group (one torch import)."""
    import torch.distributed as dist

    directories = [Path(d) for d in args.dir]
    world = read_json(directories[0] / "scenario.json")["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank,
                            world_size=world, timeout=datetime.timedelta(seconds=DDP_TIMEOUT_S))
    for directory in directories:
        config = read_json(directory / "scenario.json")
        try:
            model = train_ddp(directory, config, args.rank)
        except (RuntimeError, TypeError) as e:  # 1.13 refuses the bf16 hook without NCCL
            if config["compression"] == "none":
                raise
            # Every rank refuses alike, after DDP's constructor and before any step.
            write_json(directory / f"ddp_rank{args.rank}.unsupported",
                       str(e).splitlines()[0])
            continue
        write_json(directory / f"ddp_rank{args.rank}.json", model_state(model))
    dist.destroy_process_group()


def wait_all(procs, deadline):
    """Exit codes of procs; kills them all if the deadline passes first."""
    try:
        return [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_ddp(directories, world):
    """Runs DDP on every directory (all of `world` ranks) in one group of rank processes;
    returns, by directory, "ok" or why this torch cannot run the scenario's DDP variant."""
    for directory in directories:
        for r in range(world):
            (directory / f"ddp_rank{r}.json").unlink(missing_ok=True)
            (directory / f"ddp_rank{r}.unsupported").unlink(missing_ok=True)
    # The ranks meet in a file, not on a port chosen beforehand: no other
    # process can take a file between its choice and its use.
    store = directories[0].parent / f"ddp-{world}.store"
    store.unlink(missing_ok=True)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    logs = [directories[0].parent / f"ddp-{world}-rank{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            command = [sys.executable, str(Path(__file__).resolve()), "_ddp_worker",
                       "--rank", str(r), "--store", str(store)]
            for directory in directories:
                command += ["--dir", str(directory)]
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    timeout = DDP_TIMEOUT_S + DDP_TIMEOUT_PER_SCENARIO_S * len(directories)
    codes = wait_all(procs, time.monotonic() + timeout)
    if codes != [0] * world:
        reason = f"timed out after {timeout} s" if codes is None else f"exit codes {codes}"
        tail = "\n".join(logs[0].read_text().splitlines()[-20:])
        sys.exit(f"DDP run {reason}; rank 0 log {logs[0]} ends:\n{tail}")
    outcome = {}
    for directory in directories:
        refused = directory / "ddp_rank0.unsupported"
        outcome[directory] = read_json(refused) if refused.is_file() else "ok"
    return outcome


def run_single(directory, config):
    """Whole batch in one process; loss = mean over ranks' slices, each with that rank's branch."""
    torch.set_num_threads(1)
    data = read_json(directory / "data.json")
    model = build_model(directory, config)
    optimizer = make_optimizer(config, model)
    world, micro = config["world"], config["micro"]
    for step in range(config["steps"]):
        optimizer.zero_grad()
        for m in range(micro):
            losses = []
            for r in range(world):
                x, y = batch_rows(data, step * micro + m, r, world)
                losses.append(F.mse_loss(model(x, uses_branch(config, r, step, m)), y))
            (sum(losses) / world).backward()
        optimizer.step()
    return model


def cmd_pytorch(args):
    by_world = {}
    for d in args.dir:
        directory = Path(d)
        (directory / "pytorch.json").unlink(missing_ok=True)  # written last: marks a complete run
        by_world.setdefault(read_json(directory / "scenario.json")["world"], []).append(directory)
    for world, directories in sorted(by_world.items()):
        started = time.monotonic()
        outcome = run_ddp(directories, world)
        print(f"torch {torch.__version__}: DDP on {world} ranks, {len(directories)} scenarios, "
              f"{time.monotonic() - started:.1f} s")
        for directory in directories:
            config = read_json(directory / "scenario.json")
            write_json(directory / "single.json", model_state(run_single(directory, config)))
            write_json(directory / "pytorch.json",
                       {"torch": torch.__version__, "ddp": outcome[directory]})

# ---------------------------------------------------------------------------
# compare


def load_state(path):
    """State file with tensors as float64 tensors (exact for float32 values)."""
    state = read_json(path)
    return {kind: {name: None if t is None else tensor_from_json(t, torch.float64)
                   for name, t in state[kind].items()}
            for kind in ("params", "grads", "buffers")}


def max_diff(a, b):
    if a.shape != b.shape:
        return math.inf
    return (a - b).abs().max().item() if a.numel() else 0.0


def within(reference, value, tol):
    if reference.shape != value.shape:
        return False
    atol, rtol = tol
    return bool(((value - reference).abs() <= atol + rtol * reference.abs()).all())


def null_or_defined(t):
    return "null" if t is None else "defined"


def compare_states(label, reference, state, kinds, tol, failures, observed):
    """Checks state against reference for the given kinds; records the largest diffs."""
    for kind in kinds:
        if set(reference[kind]) != set(state[kind]):
            failures.append(f"{label}: {kind} names differ: reference {sorted(reference[kind])}, "
                            f"trainrun {sorted(state[kind])}")
            continue
        for name, ref in reference[kind].items():
            value = state[kind][name]
            if (ref is None) != (value is None):
                failures.append(f"{label}: {kind} {name} is {null_or_defined(value)} but the "
                                f"reference's is {null_or_defined(ref)}")
                continue
            if ref is None:
                continue
            diff = max_diff(ref, value)
            observed[kind] = max(observed.get(kind, 0.0), diff)
            if not within(ref, value, tol):
                failures.append(f"{label}: {kind} {name} max abs diff {diff:.3g} beyond "
                                f"atol {tol[0]:g} rtol {tol[1]:g}")


def ddp_tolerances(config):
    """(params and grads, buffers) tolerances against DDP rank 0."""
    if config["compression"] == "bf16":
        return BF16, BF16
    # With find_unused_parameters trainrun lays its buckets out as DDP does, so
    # Gloo's ring adds every element up in the same order on any number of ranks.
    # Without it DDP's first iteration uses one bucket in registration order.
    if config["world"] == 2 or config["find_unused"]:
        return EXACT, EXACT
    params = VS_DDP_ADAM_MANY_RANKS if config["optimizer"] == "adam" else VS_DDP_SGD_MANY_RANKS
    return params, VS_DDP_BUFFERS_MANY_RANKS


def check_ranks_agree(trainrun, failures):
    """All of trainrun's ranks hold rank 0's params, grads and buffers, bit for bit."""
    observed = {}
    for r in range(1, len(trainrun)):
        compare_states(f"trainrun rank {r} vs rank 0", trainrun[0], trainrun[r],
                       ("params", "grads", "buffers"), EXACT, failures, observed)


def single_tolerance(config):
    return BF16 if config["compression"] == "bf16" else VS_SINGLE


def ddp_is_right(config, ddp, single):
    """Whether DDP's ranks agree and rank 0 has the one-process params and grads.

    Prints (does not fail) where not, so the oracle shows where DDP is wrong:
    torch 1.13 with no_sync and find_unused_parameters leaves each rank its own
    accumulated gradient for a parameter used only inside no_sync (accumulate_*).
    """
    name, tol, right = config["scenario"], single_tolerance(config), True
    for kind in ("params", "grads"):
        differences = []
        for tensor, ref in single[kind].items():
            value = ddp[0][kind][tensor]
            if (ref is None) != (value is None):
                differences.append(f"{tensor} {null_or_defined(value)} "
                                   f"(one process: {null_or_defined(ref)})")
            elif ref is not None and not within(ref, value, tol):
                differences.append(f"{tensor} {max_diff(ref, value):.3g}")
        if differences:
            right = False
            print(f"note {name}: DDP rank 0 {kind} differ from one process (max abs diff): "
                  f"{', '.join(differences)}")
    for r in range(1, len(ddp)):
        spread = max(max_diff(ddp[0]["params"][n], p) for n, p in ddp[r]["params"].items())
        if spread:
            right = False
            print(f"note {name}: DDP rank {r} params differ from rank 0's: "
                  f"max abs diff {spread:.3g}")
    return right


def format_observed(observed):
    return " ".join(f"{kind} {diff:.3g}" for kind, diff in observed.items()) or "nothing compared"


def cmd_compare(args):
    """Every directory; exit 1 when any fails."""
    failed = [d for d in args.dir if not compare(Path(d), args.trainrun_prefix)]
    if failed:
        sys.exit(1)


def compare(directory, trainrun_prefix):
    """Prints the verdict on one directory; whether it passed. A prefix without a
    directory part names the trainrun files inside `directory`."""
    if "/" not in trainrun_prefix:
        trainrun_prefix = str(directory / trainrun_prefix)
    config = read_json(directory / "scenario.json")
    meta = read_json(directory / "pytorch.json")
    world, name = config["world"], config["scenario"]
    paths = [Path(f"{trainrun_prefix}{r}.json") for r in range(world)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"FAIL {name} W={world}: no trainrun state {', '.join(missing)}")
        return False
    trainrun = [load_state(p) for p in paths]
    single = load_state(directory / "single.json")
    failures, summary = [], []

    check_ranks_agree(trainrun, failures)

    # DDP is the reference for BatchNorm statistics, which one process updates
    # once per rank's slice; elsewhere it is one where it agrees with one process.
    batch_norm = name.startswith("bn_")
    if meta["ddp"] == "ok":
        ddp = [load_state(directory / f"ddp_rank{r}.json") for r in range(world)]
        if ddp_is_right(config, ddp, single) or batch_norm:
            tol, buffer_tol = ddp_tolerances(config)
            observed = {}
            compare_states("vs DDP", ddp[0], trainrun[0], ("params", "grads"), tol, failures,
                           observed)
            compare_states("vs DDP", ddp[0], trainrun[0], ("buffers",), buffer_tol, failures,
                           observed)
            summary.append(f"vs DDP rank 0: {format_observed(observed)}")
        else:
            summary.append("not vs DDP (wrong here)")
    else:
        print(f"note {name}: torch {meta['torch']} cannot run its DDP: {meta['ddp']}")
        summary.append("not vs DDP (cannot run)")

    if not batch_norm:
        observed = {}
        compare_states("vs one process", single, trainrun[0], ("params", "grads"),
                       single_tolerance(config), failures, observed)
        summary.append(f"vs one process: {format_observed(observed)}")

    for failure in failures:
        print(f"FAIL {name} W={world}: {failure}")
    if failures:
        return False
    print(f"ok {name} W={world} (torch {meta['torch']}): {'; '.join(summary)}")
    return True

# ---------------------------------------------------------------------------
# sampler


def cmd_sampler(args):
    from torch.utils.data.distributed import DistributedSampler

    world = 3
    out = {}
    for size in (10, 101, 1000):
        for shuffle in (False, True):
            for drop_last in (False, True):
                for epoch in range(4):
                    for rank in range(world):
                        sampler = DistributedSampler(range(size), num_replicas=world, rank=rank,
                                                     shuffle=shuffle, seed=0, drop_last=drop_last)
                        sampler.set_epoch(epoch)
                        key = f"{size}/{json.dumps(shuffle)}/{json.dumps(drop_last)}/{epoch}/{rank}"
                        out[key] = list(sampler)
    write_json(args.torch_json, out)

# ---------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="write OUT/<scenario>-<world>/: scenario.json, "
                            "init.json, data.json (every scenario on 2 and 3 ranks by default)")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--world", action="append", type=int, choices=(2, 3))
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_prepare)
    p = commands.add_parser("pytorch", help="run DDP and one process on prepared directories")
    p.add_argument("--dir", required=True, action="append")
    p.set_defaults(run=cmd_pytorch)
    p = commands.add_parser("compare", help="check trainrun's state files against PyTorch's")
    p.add_argument("--dir", required=True, action="append")
    p.add_argument("--trainrun-prefix", required=True,
                   help="reads PREFIX{rank}.json; a bare name is taken inside each --dir")
    p.set_defaults(run=cmd_compare)
    p = commands.add_parser("sampler", help="write DistributedSampler's indices")
    p.add_argument("--torch-json", required=True)
    p.set_defaults(run=cmd_sampler)
    p = commands.add_parser("_ddp_worker", help="internal: one DDP rank")
    p.add_argument("--dir", required=True, action="append")
    p.add_argument("--rank", required=True, type=int)
    p.add_argument("--store", required=True)
    p.set_defaults(run=cmd_ddp_worker)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
