"""The public NKI tutorial kernels, written against this package's NKI API.

Each module holds one kernel plus its PyTorch reference (``reference``, written with
tensor methods: this package never imports torch); the runnable walkthroughs are in
``examples/nki/``.
"""

from .add import nki_tensor_add
from .attention import fused_attention
from .layernorm import nki_layernorm
from .matmul import nki_matmul_hoisted, nki_matmul_tiled
from .rmsnorm import nki_rmsnorm
from .softmax import nki_softmax

__all__ = [
    "fused_attention",
    "nki_layernorm",
    "nki_matmul_hoisted",
    "nki_matmul_tiled",
    "nki_rmsnorm",
    "nki_softmax",
    "nki_tensor_add",
]
