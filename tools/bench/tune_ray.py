"""The Ray Tune side of tools/bench/tune.py.

The recipe of plugins/fashion_mnist as tune.py runs it, in PyTorch: ResNet-18
with a 1-channel conv1 and FashionMNIST from ddp_torchrun.py, a
DistributedSampler (shuffled, the trial's seed, set_epoch), the trial's
batch_size and Adam lr, --batches batches in each of --epochs epochs; at each
epoch's end --eval-batches test batches of batch_size (unshuffled) evaluated,
then ray.train.report({loss, accuracy, epoch, ...}) with a checkpoint (model,
optimizer, epoch), as the plugin reports with one. (recovery_fashion_torch.py's
train() has the batch 32 and lr 1e-3 built in, so the loop is written out here.)

Each trial is a TorchTrainer of Ray Train V1 (RAY_TRAIN_V2_ENABLED=0: V2's
TorchTrainer cannot be handed to a Tuner) with 1 worker of 1 CPU and a trainer
actor of 0 CPUs (V1's default, 1 CPU, would let one trial run at a time on two
cores), run by ray.tune.Tuner(trainer, param_space={"train_loop_config": ...},
tune_config=TuneConfig(metric="accuracy", mode="max", num_samples,
scheduler=FIFO or ASHAScheduler(time_attr="training_iteration", max_t,
grace_period, reduction_factor), max_concurrent_trials)) on a local Ray cluster
(127.0.0.1, no dashboard, --num-cpus CPUs).

  search: the configs are either --configs FILE (a JSON list of the
    train_loop_configs to run, in order: tune.grid_search over them, one
    sample each) or drawn from --space (JSON {"lr": ["loguniform", 1e-4, 0.1],
    "batch_size": ["choice", [32, 64, 128]]}) with BasicVariantGenerator(
    random_state=--seed) and --trials samples.
  start: --trials trivial trials, one at a time: a train_func that calls
    ray.train.report({"accuracy": 0}) once.

A tune.Callback in the driver stamps each trial's start, each result as the
driver receives it (time.time(), the analog of trainrun's controller recording
a report) and each trial's end; --out gets them as JSON: {"launched",
"ray_up", "fit_started", "fit_ended", "trials": [{"name", "config",
"status", "started_at", "ended_at", "reports": [{"time", "worker_time",
"iteration", "metrics"}]}]} (unix seconds).

  /opt/trainrun-ray/bin/python tune_ray.py search --out FILE --storage DIR
      [--scheduler fifo|asha] [--configs FILE | --space JSON --trials 8 --seed 0]
      [--epochs 4] [--batches 50] [--eval-batches 20] [--max-concurrent-trials 2]
  /opt/trainrun-ray/bin/python tune_ray.py start --out FILE --storage DIR [--trials 10]
"""
import argparse
import itertools
import json
import os
import tempfile
import time

LAUNCHED = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))


def fashion_train_func(config):
    """One trial's worker: the plugin's epochs, a report with a checkpoint after each."""
    import torch
    import torch.nn as nn
    import ray.train
    import ray.train.torch

    from ddp_torchrun import fashion_mnist, fashion_resnet18

    torch.set_num_threads(int(config.get("threads", 1)))
    context = ray.train.get_context()
    world, rank = context.get_world_size(), context.get_world_rank()
    batch_size, seed = int(config["batch_size"]), int(config.get("seed", 0))
    train_set, test_set = fashion_mnist("train"), fashion_mnist("t10k")
    torch.manual_seed(seed)
    net = fashion_resnet18()
    optimizer_state, first_epoch = None, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
        net.load_state_dict(state["model"])
        optimizer_state, first_epoch = state["optimizer"], state["epoch"]
    model = ray.train.torch.prepare_model(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    sampler = torch.utils.data.distributed.DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_set, num_replicas=world, rank=rank, shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=batch_size,
                                              sampler=test_sampler)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(first_epoch, int(config["epochs"])):
        sampler.set_epoch(epoch)
        losses = []
        for x, y in itertools.islice(loader, int(config["batches"])):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        totals = torch.zeros(3, dtype=torch.float64)  # correct, loss, count
        model.eval()
        with torch.no_grad():
            for x, y in itertools.islice(test_loader, int(config["eval_batches"])):
                output = model(x)
                totals += torch.tensor(
                    [output.argmax(1).eq(y).sum().item(),
                     nn.functional.cross_entropy(output, y, reduction="sum").item(), y.size(0)],
                    dtype=torch.float64)
        model.train()
        if world > 1:
            torch.distributed.all_reduce(totals)
        metrics = {"epoch": epoch, "loss": sum(losses) / max(len(losses), 1),
                   "steps": len(losses), "accuracy": (totals[0] / totals[2]).item(),
                   "test_loss": (totals[1] / totals[2]).item()}
        if rank != 0:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch + 1}, os.path.join(directory, "state.pt"))
            metrics["worker_time"] = time.time()
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def trivial_train_func(config):
    """The per-trial start overhead's trial: one report, then return."""
    import ray.train
    ray.train.report({"accuracy": 0, "worker_time": time.time()})


def make_recorder():
    """A tune.Callback that stamps trials' starts, results and ends as the driver sees them."""
    from ray.tune import Callback

    class Recorder(Callback):
        def __init__(self):
            self.trials = {}  # the driver's one thread calls the callbacks

        def entry(self, trial):
            if trial.trial_id not in self.trials:
                config = trial.config.get("train_loop_config", trial.config)
                self.trials[trial.trial_id] = {
                    "name": str(trial), "config": dict(config), "status": "pending",
                    "started_at": None, "ended_at": None, "reports": []}
            return self.trials[trial.trial_id]

        def on_trial_start(self, iteration, trials, trial, **info):
            self.entry(trial)["started_at"] = time.time()
            self.entry(trial)["status"] = "running"

        def on_trial_result(self, iteration, trials, trial, result, **info):
            now = time.time()
            metrics = {k: v for k, v in result.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.entry(trial)["reports"].append({
                "time": now, "worker_time": result.get("worker_time"),
                "iteration": result.get("training_iteration"), "metrics": metrics})

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.entry(trial)["ended_at"] = time.time()
            self.entry(trial)["status"] = "finished"

        def on_trial_error(self, iteration, trials, trial, **info):
            self.entry(trial)["ended_at"] = time.time()
            self.entry(trial)["status"] = "failed"

    return Recorder()


def search_space(args, tune):
    """(param_space's train_loop_config, search_alg or None, num_samples) of `args`."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if args.configs:
        with open(args.configs) as f:
            configs = json.load(f)
        return tune.grid_search(configs), None, 1
    space = {}
    for key, spec in json.loads(args.space).items():
        kind = spec[0]
        if kind == "loguniform":
            space[key] = tune.loguniform(spec[1], spec[2])
        elif kind == "uniform":
            space[key] = tune.uniform(spec[1], spec[2])
        elif kind == "randint":
            space[key] = tune.randint(spec[1], spec[2])
        elif kind == "choice":
            space[key] = tune.choice(spec[1])
        elif kind == "grid":
            space[key] = tune.grid_search(spec[1])
        else:
            raise SystemExit(f"unknown search space kind {kind!r} of {key}")
    # A generator instance takes the concurrency limit itself (the Tuner's
    # max_concurrent_trials goes only to a Searcher).
    return (space, BasicVariantGenerator(random_state=args.seed,
                                         max_concurrent=args.max_concurrent_trials),
            args.trials)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["search", "start"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--name", default="tune")
    parser.add_argument("--scheduler", choices=["fifo", "asha"], default="fifo")
    parser.add_argument("--configs", help="a JSON file: the list of train_loop_configs to run")
    parser.add_argument("--space", default='{"lr": ["loguniform", 1e-4, 0.1], '
                                            '"batch_size": ["choice", [32, 64, 128]]}')
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--grace-period", type=int, default=1)
    parser.add_argument("--reduction-factor", type=float, default=2)
    parser.add_argument("--max-concurrent-trials", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    args.out, args.storage = os.path.abspath(args.out), os.path.abspath(args.storage)

    # Loopback only, set before Ray reads it at import and for the processes it
    # starts; Train V1, whose TorchTrainer a Tuner takes.
    os.environ.update(RAY_TRAIN_V2_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                      GLOO_SOCKET_IFNAME="lo", RAY_USAGE_STATS_ENABLED="0",
                      RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS="0",
                      PYTHONPATH=os.pathsep.join(
                          p for p in [HERE, os.environ.get("PYTHONPATH")] if p))
    import ray
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    fixed = {"epochs": args.epochs, "batches": args.batches, "eval_batches": args.eval_batches,
             "seed": 0, "threads": 1}
    if args.mode == "search":
        space, search_alg, samples = search_space(args, tune)
        train_func, metric, mode = fashion_train_func, "accuracy", "max"
        concurrent = args.max_concurrent_trials
    else:
        space, search_alg, samples = {"x": tune.uniform(0, 1)}, None, args.trials
        train_func, metric, mode, concurrent = trivial_train_func, "accuracy", "max", 1
    scheduler = (ASHAScheduler(time_attr="training_iteration", max_t=args.epochs,
                               grace_period=args.grace_period,
                               reduction_factor=args.reduction_factor)
                 if args.scheduler == "asha" and args.mode == "search" else FIFOScheduler())
    recorder = make_recorder()
    summary = {"launched": LAUNCHED}
    # Ray's sockets go there: a short path (theirs within 107 bytes).
    with tempfile.TemporaryDirectory(prefix="ray-") as ray_tmp:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 _node_ip_address="127.0.0.1", _temp_dir=ray_tmp, log_to_driver=False)
        try:
            summary["ray_up"] = time.time()
            trainer = TorchTrainer(
                train_func, train_loop_config=fixed,
                scaling_config=ray.train.ScalingConfig(
                    num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1},
                    trainer_resources={"CPU": 0}))
            tuner = tune.Tuner(
                trainer, param_space={"train_loop_config": space},
                tune_config=tune.TuneConfig(metric=metric, mode=mode, num_samples=samples,
                                            scheduler=scheduler, search_alg=search_alg,
                                            max_concurrent_trials=concurrent),
                run_config=tune.RunConfig(name=args.name, storage_path=args.storage,
                                          callbacks=[recorder], verbose=0))
            summary["fit_started"] = time.time()
            results = tuner.fit()
            summary["fit_ended"] = time.time()
            summary["errors"] = len(results.errors)
        finally:
            ray.shutdown()
    summary["trials"] = list(recorder.trials.values())
    with open(args.out + ".tmp", "w") as out:
        json.dump(summary, out)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
