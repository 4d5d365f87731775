"""nki-transformer-kernels: NKI kernels for Hugging Face ``kernels``, variant ``torch-neuron``.

``layers`` holds the kernelize layers (``RMSNorm``, ``NKIViTMLP`` and its layout
class); the functional ops are ``rms_norm`` and ``mlp`` (torch custom ops backed
by the NKI kernels ``rms_norm_kernel`` and ``mlp_kernel``).
"""
from . import layers
from ._kernels import mlp_kernel, rms_norm_kernel
from ._ops import mlp, rms_norm

__all__ = ["layers", "mlp", "mlp_kernel", "rms_norm", "rms_norm_kernel"]
