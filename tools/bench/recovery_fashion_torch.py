"""The torchrun and Ray Train sides of tools/bench/recovery_fashion.py.

The recipe of plugins/fashion_mnist as recovery_fashion.py runs it, in
PyTorch: ResNet-18 with a 1-channel conv1 and FashionMNIST from
ddp_torchrun.py, DistributedDataParallel over gloo, DistributedSampler (shuffled,
seed 0, set_epoch), batch 32 per rank, Adam lr 1e-3, --batches batches per rank
in each of --epochs epochs. At each epoch's end every rank evaluates
--val-batches batches of its share of the test set (the accuracy summed across
ranks with all_reduce), then rank 0 saves a checkpoint (model, optimizer, next
epoch) and every rank waits for it. On start, training resumes from the latest
checkpoint.

Two front ends run the same loop, on loopback only:
  torchrun: rank 0 writes STORAGE/checkpoint.pt (atomically: a rename), then a
    barrier; torchrun --max_restarts 1 restarts the group after a failure.
  ray: the driver starts a local Ray cluster (127.0.0.1, no dashboard) and runs
    the loop as a TorchTrainer's train_func on 3 workers of 1 CPU, with
    FailureConfig(max_failures=1) and storage under STORAGE; the checkpoint goes
    through ray.train.report(metrics, checkpoint=Checkpoint.from_directory(...))
    and comes back through ray.train.get_checkpoint().

Each rank writes its pid to EVENTS/rank<r>.pid when it starts (where the bench
finds the process to kill) and appends "<unix seconds> <pid> <event> <epoch>
<value>" lines to EVENTS/rank<r>.txt: "start" once the group is formed, the data
and the checkpoint loaded (value: the first epoch), "step" after each optimizer step
(value: the step, from 1), "checkpoint" once the epoch's checkpoint is saved
(value: the test accuracy).

  torchrun --nproc_per_node 3 --max_restarts 1 --monitor_interval 1 --redirects 2 --tee 1 \\
      --log_dir DIR --master_addr 127.0.0.1 recovery_fashion_torch.py torchrun \\
      --events DIR --storage DIR [--epochs 2] [--batches 40] [--val-batches 20]
  /opt/trainrun-ray/bin/python recovery_fashion_torch.py ray --events DIR --storage DIR ...
"""
import argparse
import itertools
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_torchrun import fashion_mnist, fashion_resnet18

BATCH = 32
WORKERS = 3


def log_event(events, event, epoch, value):
    """Appends one event line to this rank's file in `events`."""
    rank = dist.get_rank()
    with open(os.path.join(events, f"rank{rank}.txt"), "a") as out:
        out.write(f"{time.time():.6f} {os.getpid()} {event} {epoch} {value}\n")


def write_pid(events):
    """Writes this process's pid to `events`/rank<r>.pid, atomically."""
    path = os.path.join(events, f"rank{dist.get_rank()}.pid")
    with open(path + ".tmp", "w") as out:
        out.write(f"{os.getpid()}\n")
    os.replace(path + ".tmp", path)


def evaluate(model, test_set, val_batches):
    """Test accuracy over `val_batches` batches of each rank's share, summed across ranks."""
    sampler = torch.utils.data.distributed.DistributedSampler(test_set, shuffle=False)
    loader = torch.utils.data.DataLoader(test_set, batch_size=BATCH, sampler=sampler)
    totals = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in itertools.islice(loader, val_batches):
            totals += torch.tensor([model(x).argmax(1).eq(y).sum().item(), y.size(0)],
                                   dtype=torch.float64)
    model.train()
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def train(args, state, wrap, save):
    """The epochs after `state`'s (a checkpoint's dict, or None) on the current process group.

    wrap(net) makes the DistributedDataParallel model; save(state, metrics) is
    called on every rank at each epoch's end and must return once the
    checkpoint is saved."""
    write_pid(args.events)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    train_set, test_set = fashion_mnist("train"), fashion_mnist("t10k")
    torch.manual_seed(0)
    net = fashion_resnet18()
    if state is not None:
        net.load_state_dict(state["model"])
    model = wrap(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    first_epoch = state["epoch"] if state is not None else 0
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    log_event(args.events, "start", first_epoch, first_epoch)
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(itertools.islice(loader, args.batches), 1):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
            log_event(args.events, "step", epoch, step)
        accuracy = evaluate(model, test_set, args.val_batches)
        save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
             {"epoch": epoch, "accuracy": accuracy})
        log_event(args.events, "checkpoint", epoch, accuracy)


def torchrun_main(args):
    """One rank under torchrun: the checkpoint is STORAGE/checkpoint.pt."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    dist.init_process_group("gloo")
    path = os.path.join(args.storage, "checkpoint.pt")
    state = torch.load(path) if os.path.exists(path) else None

    def save(state, metrics):
        if dist.get_rank() == 0:
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()

    train(args, state, nn.parallel.DistributedDataParallel, save)
    dist.destroy_process_group()


def ray_train_func(config):
    """TorchTrainer's train_func: the checkpoint goes through ray.train."""
    import ray.train
    import ray.train.torch

    args = argparse.Namespace(**config)
    state = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))

    def save(state, metrics):
        if dist.get_rank() != 0:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:
            torch.save(state, os.path.join(directory, "state.pt"))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    train(args, state, ray.train.torch.prepare_model, save)


def ray_main(args):
    """The driver: a local Ray cluster on 127.0.0.1 and a TorchTrainer with one retry."""
    # Loopback only, set before Ray reads it at import and for the processes it
    # starts: the node's address (Ray Train's MASTER_ADDR), gloo's interface, and
    # no usage statistics sent.
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", GLOO_SOCKET_IFNAME="lo",
                      RAY_USAGE_STATS_ENABLED="0")
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    # Ray's sockets go there: a short path (theirs within 107 bytes).
    with tempfile.TemporaryDirectory(prefix="ray-") as ray_tmp:
        ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, _temp_dir=ray_tmp)
        try:
            TorchTrainer(
                ray_train_func, train_loop_config=vars(args),
                scaling_config=ray.train.ScalingConfig(num_workers=WORKERS, use_gpu=False,
                                                       resources_per_worker={"CPU": 1}),
                run_config=ray.train.RunConfig(
                    name="fashion", storage_path=os.path.join(args.storage, "results"),
                    failure_config=ray.train.FailureConfig(max_failures=1))).fit()
        finally:
            ray.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("front_end", choices=["torchrun", "ray"])
    parser.add_argument("--events", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--val-batches", type=int, default=20)
    args = parser.parse_args()
    args.events, args.storage = os.path.abspath(args.events), os.path.abspath(args.storage)
    (torchrun_main if args.front_end == "torchrun" else ray_main)(args)


if __name__ == "__main__":
    main()
