"""torch.compile of a DDP-wrapped module: Dynamo's DDPOptimizer branch compiles with the caller's
dispatch modes off, as Dynamo compiles every other frame."""

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Net(nn.Module):
    # 1 MiB weights: DDPOptimizer's first bucket (1 MiB, as DDP's) takes l2, the second l1
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class _Seen(TorchDispatchMode):
    """Counts the ops it sees on the compiler's tensors (fake, functional) and on the run's."""

    def __init__(self):
        super().__init__()
        self.compiler_ops, self.run_ops = [], 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # off while torch.compile traces, on while compiled code runs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, (FakeTensor, FunctionalTensor)) for t in tree_leaves((args, kwargs, out))):
            self.compiler_ops.append(func)
        else:
            self.run_ops += 1
        return out


def test_a_mode_that_ignores_compile_internals_sees_only_the_run_of_a_compiled_ddp_model(fresh_dynamo):
    # Dynamo's branch for DDP (DDPOptimizer: one graph per gradient bucket) left the caller's modes
    # on while it traced and compiled: such a mode saw Dynamo's fake tensors and DDPOptimizer's
    # fake-mode runs (a readiness recording counted them; a dry run failed with "Mixing fake modes").
    dist.init_process_group("neuron", rank=0, world_size=1, store=dist.HashStore())
    try:
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch.manual_seed(0)
        model = torch.compile(DDP(_Net().to("neuron"), bucket_cap_mb=1), backend=backend)
        seen = _Seen()
        with seen:
            model(torch.randn(8, 256, device="neuron")).sum().backward()
    finally:
        dist.destroy_process_group()
    assert len(graphs) == 2  # DDPOptimizer split the graph at the bucket boundary
    assert seen.compiler_ops == []
    assert seen.run_ops > 0  # the compiled graphs' ops, the backward and DDP's all-reduce
    assert all(p.grad is not None for p in model.parameters())
