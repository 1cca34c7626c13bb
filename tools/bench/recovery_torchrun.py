"""The torchrun side of the recovery benchmark (tools/bench/recovery.py).

The same loop as the ddp_plugin's `recovery` entry: an MLP 64-256-256-10 under
DistributedDataParallel (gloo), Adam lr 1e-3, a batch of 64 per rank, and after
every step a checkpoint of model and optimizer that rank 0 writes and renames
into place. On start it resumes from that checkpoint. Each rank appends
"<event> <step> <unix seconds> <pid>" lines to EVENTS/rank<r>.txt: "start" once
the process group is formed, "loaded" once the checkpoint is read, "step"
after each step.
Run with: torchrun --nproc_per_node 2 --max_restarts 1 recovery_torchrun.py EVENTS CKPT STEPS
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def log_event(events, rank, event, step):
    with open(os.path.join(events, f"rank{rank}.txt"), "a") as out:
        out.write(f"{event} {step} {time.time():.6f} {os.getpid()}\n")


def main():
    events, checkpoint, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sleep_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    log_event(events, rank, "start", -1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 10))
    start = 0
    state = None
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        net.load_state_dict(state["model"])
        start = state["step"]
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    log_event(events, rank, "loaded", start)
    torch.manual_seed(rank)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, steps):
        x = torch.randn(64, 64)
        y = torch.randint(0, 10, (64,))
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        log_event(events, rank, "step", step)
        if rank == 0:
            tmp = checkpoint + ".tmp"
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1}, tmp)
            os.replace(tmp, checkpoint)
        dist.barrier()  # as trainrun's report: every rank waits for the checkpoint
        time.sleep(sleep_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
