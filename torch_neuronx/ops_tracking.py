"""Fidelity accounting: which ops ran, and which would not be native on Trainium.

Ops that real Trainium does not run natively (float64 and complex dtypes,
unsigned 16-64 bit integers, dense linear-algebra factorizations) still run here
but are recorded and warned about once per op, as the real system does for its
CPU fallbacks. ``TORCH_NEURONX_STRICT_FALLBACK=1`` makes them an error.
"""

from . import _C


def get_executed_ops() -> dict:
    """Op name -> number of executions on neuron since the last clear."""
    return dict(sorted(_C._executed_ops()))


def get_fallback_ops() -> dict:
    """Op name -> sorted reasons it would fall back to CPU on real Trainium."""
    return {op: sorted(reasons) for op, reasons in _C._fallback_ops().items()}


def clear_op_tracking() -> None:
    """Forget executed and fallback ops (and re-arm the once-per-op warnings)."""
    _C._clear_op_tracking()
