"""NKI data types and exact rounding on host.

Floating tiles are stored as float32 NumPy arrays holding values already rounded
to the tile's dtype (bf16/fp16/tf32/fp8 are exact subsets of float32), which is
what the engines do: they compute in fp32 internally and round on write.
"""

import numpy as np
import torch


class dtype:
    """An NKI element type (``nl.float32``, ``nl.bfloat16``, ...)."""

    def __init__(self, name, itemsize, kind, torch_dtype, np_storage):
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # "f" float, "i" signed int, "u" unsigned int, "b" bool
        self.torch_dtype = torch_dtype
        self.np_storage = np_storage

    @property
    def is_float(self):
        return self.kind == "f"

    def __repr__(self):
        return f"nl.{self.name}"


float32 = dtype("float32", 4, "f", torch.float32, np.float32)
tfloat32 = dtype("tfloat32", 4, "f", torch.float32, np.float32)
bfloat16 = dtype("bfloat16", 2, "f", torch.bfloat16, np.float32)
float16 = dtype("float16", 2, "f", torch.float16, np.float32)
float8_e4m3 = dtype("float8_e4m3", 1, "f", torch.float8_e4m3fn, np.float32)
float8_e5m2 = dtype("float8_e5m2", 1, "f", torch.float8_e5m2, np.float32)
int32 = dtype("int32", 4, "i", torch.int32, np.int32)
int16 = dtype("int16", 2, "i", torch.int16, np.int16)
int8 = dtype("int8", 1, "i", torch.int8, np.int8)
uint32 = dtype("uint32", 4, "u", torch.uint32, np.uint32)
uint16 = dtype("uint16", 2, "u", torch.uint16, np.uint16)
uint8 = dtype("uint8", 1, "u", torch.uint8, np.uint8)
bool_ = dtype("bool_", 1, "b", torch.bool, np.bool_)

ALL = [float32, tfloat32, bfloat16, float16, float8_e4m3, float8_e5m2,
       int32, int16, int8, uint32, uint16, uint8, bool_]
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool": bool_, "float": float32, "half": float16})
_FROM_TORCH = {d.torch_dtype: d for d in ALL if d is not tfloat32}
_FROM_NUMPY = {np.dtype(np.float32): float32, np.dtype(np.float64): float32,
               np.dtype(np.float16): float16, np.dtype(np.int32): int32,
               np.dtype(np.int64): int32, np.dtype(np.int16): int16, np.dtype(np.int8): int8,
               np.dtype(np.uint32): uint32, np.dtype(np.uint16): uint16,
               np.dtype(np.uint8): uint8, np.dtype(np.bool_): bool_}


def as_dtype(d):
    """Accept an NKI dtype, a torch dtype, a NumPy dtype or a name."""
    if d is None or isinstance(d, dtype):
        return d
    if isinstance(d, torch.dtype):
        if d in _FROM_TORCH:
            return _FROM_TORCH[d]
        if d == torch.float64:
            return float32
        if d == torch.int64:
            return int32
        raise TypeError(f"NKI has no dtype matching torch.{d}")
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    try:
        return _FROM_NUMPY[np.dtype(d)]
    except (KeyError, TypeError):
        raise TypeError(f"NKI has no dtype matching {d!r}") from None


def _round_tf32(a):
    bits = a.astype(np.float32).view(np.uint32)
    # round-to-nearest-even on the 13 dropped mantissa bits
    bias = ((bits >> 13) & 1) + 0x0FFF
    return ((bits + bias) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def round_to(a, d):
    """Return ``a`` (array-like) rounded to dtype ``d`` in its host storage type."""
    a = np.asarray(a)
    if d.kind == "f":
        a = a.astype(np.float32, copy=False)
        if d is float32:
            return a
        if d is tfloat32:
            return _round_tf32(a)
        a = np.ascontiguousarray(a)
        if not a.flags.writeable:
            a = a.copy()
        t = torch.from_numpy(a).to(d.torch_dtype).to(torch.float32)
        return t.numpy()
    if d.kind == "b":
        return a.astype(np.bool_)
    if a.dtype.kind == "f":
        a = np.trunc(a)
    info = np.iinfo(d.np_storage)
    return np.clip(a, info.min, info.max).astype(d.np_storage)


def promote(*ds):
    """Result dtype of an elementwise op on operands of dtypes ``ds`` (None = scalar)."""
    ds = [d for d in ds if d is not None]
    if not ds:
        return float32
    floats = [d for d in ds if d.is_float]
    if floats:
        if all(d is floats[0] for d in floats):
            return floats[0]
        return float32
    return max(ds, key=lambda d: d.itemsize)
