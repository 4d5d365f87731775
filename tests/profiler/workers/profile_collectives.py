"""Worker (torchrun, 2 ranks): profiles neuron collectives, writes each rank's Chrome trace."""

import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile


def main(out_dir):
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4096,), float(rank + 1), device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        gathered = torch.empty(world * 4096, device="neuron")
        dist.all_gather_into_tensor(gathered, t)
    expected = float(sum(range(1, world + 1))) * world
    torch.testing.assert_close(t.cpu(), torch.full((4096,), expected))
    prof.export_chrome_trace(os.path.join(out_dir, f"trace_rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
