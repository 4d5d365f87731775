"""Elementwise math of the NKI engines as NumPy functions on float32 arrays (no torch).

Each entry is the exact function (computed in float64 where NumPy lacks a float32
routine, then rounded by the caller to the destination dtype), matching what the
Scalar/Vector engines compute in fp32.
"""

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(a):
    return _erf(np.asarray(a, np.float64)).astype(np.float64)


def sigmoid(a):
    a = np.asarray(a, np.float64)
    return np.where(a >= 0, 1.0 / (1.0 + np.exp(-np.abs(a))), np.exp(-np.abs(a)) / (1.0 + np.exp(-np.abs(a))))


def gelu(a):
    a = np.asarray(a, np.float64)
    return 0.5 * a * (1.0 + erf(a / math.sqrt(2.0)))


def gelu_dx(a):
    a = np.asarray(a, np.float64)
    pdf = np.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)
    return 0.5 * (1.0 + erf(a / math.sqrt(2.0))) + a * pdf


def gelu_apprx_tanh(a):
    a = np.asarray(a, np.float64)
    return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))


def gelu_apprx_sigmoid(a):
    """GELU approximated as x * sigmoid(1.702 x)."""
    a = np.asarray(a, np.float64)
    return a * sigmoid(1.702 * a)


def erf_dx(a):
    """Derivative of erf: 2 / sqrt(pi) * exp(-x^2)."""
    a = np.asarray(a, np.float64)
    return 2.0 / math.sqrt(math.pi) * np.exp(-a * a)


def silu(a):
    return np.asarray(a, np.float64) * sigmoid(a)


def softplus(a):
    a = np.asarray(a, np.float64)
    return np.logaddexp(0.0, a)


def mish(a):
    a = np.asarray(a, np.float64)
    return a * np.tanh(softplus(a))


def rsqrt(a):
    return 1.0 / np.sqrt(a)


def copy(a):
    return a


UNARY = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "rsqrt": rsqrt,
    "sigmoid": sigmoid,
    "relu": lambda a: np.maximum(a, 0),
    "gelu": gelu,
    "gelu_dx": gelu_dx,
    "gelu_apprx_tanh": gelu_apprx_tanh,
    "gelu_apprx_sigmoid": gelu_apprx_sigmoid,
    "silu": silu,
    "softplus": softplus,
    "mish": mish,
    "erf": erf,
    "erf_dx": erf_dx,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "arctan": np.arctan,
    "square": np.square,
    "reciprocal": lambda a: 1.0 / a,
    "sign": np.sign,
    "abs": np.abs,
    "negative": np.negative,
    "ceil": np.ceil,
    "floor": np.floor,
    "trunc": np.trunc,
    "logical_not": np.logical_not,
    "invert": np.invert,
    "copy": copy,
}
# Engines: transcendental functions run on the Scalar Engine's lookup tables; cheap
# arithmetic on the Vector Engine.
VECTOR_UNARY = {"abs", "negative", "ceil", "floor", "trunc", "logical_not", "invert", "reciprocal", "copy"}
BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "fmod": np.fmod,
    "mod": np.mod,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
}
# ALU ops usable as reductions (tensor_reduce, activation's reduce_op, ...)
REDUCE_UFUNC = {
    "add": np.add,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "multiply": np.multiply,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "prod": np.multiply,
}
