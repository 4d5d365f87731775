"""PyTorch tables keyed by device type that need an entry for `neuron`.

Unknown devices get defaults tuned for GPUs; since the simulator executes with
CPU kernels, CPU's choices are the ones that keep results equal to CPU.
"""
import torch


def apply() -> None:
    from torch.nn.modules import linear_cross_entropy_options as lce

    for (device, dtype), choice in list(lce._AUTO_DEFAULTS.items()):
        if device == "cpu":
            lce._AUTO_DEFAULTS.setdefault(("neuron", dtype), choice)
