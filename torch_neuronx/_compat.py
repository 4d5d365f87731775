"""PyTorch tables keyed by device type that need an entry for `neuron`.

Unknown devices get defaults tuned for GPUs; since the simulator executes with
CPU kernels, CPU's choices are the ones that keep results equal to CPU. Also the
hooks (PyTorch's and the Hugging Face libraries') that keep CUDA-only paths from
failing obscurely or warning about things that do not apply to neuron.
"""

import torch


def _on_module_registration(module, name, submodule):
    # DataParallel assigns `self.module` in its constructor: the moment torch lets us see it
    # without replacing anything. On neuron its forward always fails (even for one device it
    # scatters the inputs), so refuse it here with the way out.
    if (
        name == "module"
        and isinstance(module, torch.nn.DataParallel)
        and torch._utils._get_available_device_type() == "neuron"
    ):
        raise RuntimeError(
            "nn.DataParallel is not supported on neuron devices: it scatters, replicates and gathers through "
            "torch._C._scatter / _broadcast_coalesced / _gather, which exist only in CUDA builds of torch. "
            "Use DistributedDataParallel, one process per NeuronCore: launch with torchrun --nproc_per_node=N, "
            "call dist.init_process_group('neuron') and wrap DistributedDataParallel(model.to(f'neuron:{local_rank}'), "
            "device_ids=[local_rank]). For one core, run the module directly: model.to('neuron')."
        )


# torch releases whose flex_attention._validate_device is the allow-list relaxed below;
# a test compares the installed source with it, so a change in PyTorch is noticed.
FLEX_VALIDATE_DEVICE_TORCH = ("2.13.",)


def relax_flex_attention_device_check(fa_module) -> None:
    """Let torch.nn.attention.flex_attention accept neuron tensors (the one private check relaxed).

    torch 2.13's ``_validate_device`` allows only {"cuda", "cpu", "xpu", "hpu", "mps"}, with no
    hook for PrivateUse1; the op underneath is device-neutral. Only neuron tensors skip the
    check; every other device still gets PyTorch's. On other torch releases nothing changes.
    """
    if not torch.__version__.startswith(FLEX_VALIDATE_DEVICE_TORCH):
        return
    original = fa_module._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "neuron":
            return original(query, key, value)

    _validate_device.__wrapped__ = original
    fa_module._validate_device = _validate_device


def apply() -> None:
    from torch import _tensor_str
    from torch.nn.modules import linear_cross_entropy_options as lce

    from . import _hf

    _hf.install()
    torch.nn.modules.module.register_module_module_registration_hook(_on_module_registration)

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
