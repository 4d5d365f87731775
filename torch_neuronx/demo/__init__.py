"""``torch-neuronx demo``: fine-tune a tiny Llama with TRL on the ``neuron`` device.

:func:`main` runs the demo (see :mod:`torch_neuronx.demo.sft`);
:mod:`torch_neuronx.demo.hf` holds its Hugging Face building blocks (corpus,
tokenizer, tiny Llama config and checkpoint), which examples and tests reuse.
Importing this package has no side effects.
"""

from .sft import main, parse_args

__all__ = ["main", "parse_args"]
