"""Layers for ``kernels.kernelize``: stateless forwards over the replaced module's attributes.

``RMSNorm`` replaces transformers' ``LlamaRMSNorm`` (and every RMSNorm registered
under the hub name "RMSNorm": attributes ``weight`` and ``variance_epsilon``).

``NKIViTMLP`` replaces a ViT MLP block (fc1, GELU, fc2) with one fused kernel.
ViT has no hub-registered layers, so ``NKIViTMLPLayout`` is the stateful layout
class transformers swaps in for ``ViTMLP`` (``KernelConfig`` loading, or
``transformers.monkey_patching.register_patch_mapping``); it keeps the original
parameter names (checkpoints load unchanged) and the original forward (used
when kernelize falls back).
"""
import torch
from torch import nn

from ._ops import mlp, rms_norm


class RMSNorm(nn.Module):
    """NKI RMSNorm: ``weight * x * rsqrt(mean(x^2) + eps)``."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class NKIViTMLP(nn.Module):
    """NKI fused ``fc2(gelu(fc1(x)))`` for ViT's MLP block."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return mlp(hidden_states, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)


class NKIViTMLPLayout(nn.Module):
    """Same state and forward as transformers' ``ViTMLP``; kernelize swaps the forward."""

    kernel_layer_name = "NKIViTMLP"

    def __init__(self, config):
        super().__init__()
        if config.hidden_act != "gelu":
            raise ValueError(f"NKIViTMLP fuses exact GELU, the config uses {config.hidden_act!r}")
        self.config = config
        self.activation_fn = nn.GELU()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))
