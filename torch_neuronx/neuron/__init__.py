"""``torch.neuron``: the device module of AWS Trainium (logical NeuronCores).

``get_dynamo_metrics`` / ``reset_dynamo_metrics`` are lent to this module by
the compile backend at registration (torch_neuronx._registration): the device
module does not depend on the compiler.
"""

from ..profiler._graphs import _compiled_graph
from . import amp
from ._legacy_types import LEGACY_TYPES as _LEGACY_TYPES
from .device import (
    _is_in_bad_fork,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    synchronize,
)
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from .random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream

# torch.neuron.FloatTensor, torch.neuron.FloatStorage, ... (as torch.cuda has).
globals().update(_LEGACY_TYPES)


def __getattr__(name):
    # torch.utils.checkpoint stashes and replays the device RNG only when
    # `torch.<device>._initialized` is true, as for torch.cuda.
    if name == "_initialized":
        return is_initialized()
    if name == "default_generators":
        from . import random

        return random.default_generators
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")
