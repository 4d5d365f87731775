"""Helper API of the ``torch.compile`` backend ``neuron`` (the real TorchNeuron's module name).

from torch_neuronx.neuron_dynamo_backend import set_model_name
set_model_name("unet")
model = torch.compile(model, backend="neuron")
"""

from ._dynamo import get_dynamo_metrics, reset_dynamo_metrics, set_model_name

__all__ = ["set_model_name", "get_dynamo_metrics", "reset_dynamo_metrics"]
