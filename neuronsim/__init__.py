"""neuronsim: the torch-free half of torch-neuronx.

``neuronsim.nki`` is the NKI kernel simulator (also importable as ``nki``,
``neuronxcc.nki`` and ``torch_neuronx.nki``), ``neuronsim.hardware`` the one table of
Trainium figures, ``neuronsim.settings`` the registry of environment variables. They
need only the standard library and NumPy and never import torch or torch_neuronx.

This module imports nothing: the distribution's start-up file imports ``neuronsim._alias``
in every interpreter, which must stay cheap.
"""
