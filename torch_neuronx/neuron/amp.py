"""``torch.neuron.amp``: the device-specific AMP names CUDA code expects (``torch.cuda.amp``).

Deprecated in the same way as ``torch.cuda.amp``: each name delegates to ``torch.amp`` with
``device_type="neuron"`` and emits a ``FutureWarning`` that names the current spelling.
"""

import functools
import sys

import torch
from typing_extensions import deprecated

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


@deprecated(
    "`torch.neuron.amp.autocast(args...)` is deprecated. "
    "Please use `torch.amp.autocast('neuron', args...)` instead.",
    category=FutureWarning,
)
class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("neuron", ...)`` under its CUDA-style name (deprecated)."""

    if sys.version_info < (3, 13):
        # Before 3.13, inspect.signature of a @deprecated class shows `__new__`'s parameters.
        def __new__(cls, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
            return super().__new__(cls)

        def __init_subclass__(cls):
            pass

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


@deprecated(
    "`torch.neuron.amp.custom_fwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_fwd(args..., device_type='neuron')` instead.",
    category=FutureWarning,
)
def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(..., device_type="neuron")`` (deprecated)."""
    return functools.partial(torch.amp.custom_fwd, device_type="neuron")(fwd=fwd, cast_inputs=cast_inputs)


@deprecated(
    "`torch.neuron.amp.custom_bwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_bwd(args..., device_type='neuron')` instead.",
    category=FutureWarning,
)
def custom_bwd(bwd):
    """``torch.amp.custom_bwd(..., device_type="neuron")`` (deprecated)."""
    return functools.partial(torch.amp.custom_bwd, device_type="neuron")(bwd)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("neuron", ...)`` under its CUDA-style name (deprecated)."""

    @deprecated(
        "`torch.neuron.amp.GradScaler(args...)` is deprecated. "
        "Please use `torch.amp.GradScaler('neuron', args...)` instead.",
        category=FutureWarning,
    )
    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            "neuron",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
