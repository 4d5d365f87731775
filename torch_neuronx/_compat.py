"""PyTorch tables keyed by device type that need an entry for `neuron`.

Unknown devices get defaults tuned for GPUs; since the simulator executes with
CPU kernels, CPU's choices are the ones that keep results equal to CPU.
"""
import torch


def apply() -> None:
    from torch import _tensor_str
    from torch.nn.modules import linear_cross_entropy_options as lce

    # Printing formats on the host, as a user expects from a device: keeps the
    # formatter's float64 statistics from counting as device fallbacks.
    init = _tensor_str._Formatter.__init__

    def _formatter_init(self, tensor):
        init(self, tensor.cpu() if tensor.device.type == "neuron" else tensor)

    _tensor_str._Formatter.__init__ = _formatter_init

    for (device, dtype), choice in list(lce._AUTO_DEFAULTS.items()):
        if device == "cpu":
            lce._AUTO_DEFAULTS.setdefault(("neuron", dtype), choice)
    resolve = lce.LinearCrossEntropyOptions._resolve_auto_acc_dtype

    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and torch.device(device).type == "neuron":
            device = torch.device("cpu")
        return resolve(dtype, device)

    lce.LinearCrossEntropyOptions._resolve_auto_acc_dtype = staticmethod(_resolve_auto_acc_dtype)
