"""Hugging Face library messages that are wrong about neuron, filtered at autoload.

Only a public mechanism: ``logging.Filter``s on the libraries' own loggers. Nothing in the
libraries is replaced.
"""

import logging
import re

import torch

# accelerate's get_max_memory counts CUDA devices only, so with an explicit
# max_memory={0: ..., 1: ...} it calls every NeuronCore "not available" while
# placing the model on exactly those cores.
_ACCELERATE_DEVICE = re.compile(r"(?:\[RANK \d+\] )?Device (\d+) is not available, available devices are \[\]$")
# TrainingArguments(torch_compile=True) looks for CUDA Ampere's TF32.
_TRANSFORMERS_AMPERE = "The speedups for torchdynamo mostly come with GPU Ampere or higher"


class _AccelerateNeuronCoreFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        m = _ACCELERATE_DEVICE.match(record.getMessage())
        return not (m and int(m.group(1)) < torch.neuron.device_count())


class _TransformersAmpereFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith(_TRANSFORMERS_AMPERE) and torch.neuron.is_available())


_FILTERS = {
    "accelerate.utils.modeling": _AccelerateNeuronCoreFilter(),
    "transformers.training_args": _TransformersAmpereFilter(),
}


def install() -> None:
    """Attach the filters (idempotent; the libraries need not be imported yet)."""
    for name, f in _FILTERS.items():
        logger = logging.getLogger(name)
        if f not in logger.filters:
            logger.addFilter(f)
