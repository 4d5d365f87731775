"""Command-line tools of torch-neuronx (``neuron-ls``, ...)."""
