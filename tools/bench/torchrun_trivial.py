"""The torchrun side of the startup benchmark: join a Gloo group, barrier, leave."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
