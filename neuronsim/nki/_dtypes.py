"""NKI data types and exact rounding on host (NumPy only: no torch import).

Floating tiles are stored as float32 NumPy arrays holding values already rounded
to the tile's dtype (bf16/fp16/tf32/fp8 are exact subsets of float32), which is
what the engines do: they compute in fp32 internally and round on write.
"""

import sys

import numpy as np


class dtype:
    """An NKI element type (``nl.float32``, ``nl.bfloat16``, ...)."""

    def __init__(self, name, itemsize, kind, torch_name, np_storage, fmt=None):
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # "f" float, "i" signed int, "u" unsigned int, "b" bool
        self.torch_name = torch_name  # attribute of the torch module, resolved lazily
        self.np_storage = np_storage
        self.fmt = fmt  # (mantissa bits, min normal exponent, max finite, has inf)

    @property
    def is_float(self):
        return self.kind == "f"

    @property
    def dtype(self):
        """The NumPy dtype with the same bits, so that ``np.dtype(nl.float32)`` and
        ``np.dtype(nl.int8).itemsize`` work as with AWS's NKI. bf16 and FP8 are the
        ``ml_dtypes`` types (as with AWS's NKI); tf32 has no NumPy type: that is a
        NotImplementedError, not a stand-in of another format."""
        if self.kind == "f" and self.fmt is not None and self is not float16:
            ml = _ml_dtype(self)
            if ml is None:
                why = "ml_dtypes is not installed" if self.name in _ML_NAMES else f"NumPy has no {self.name} type"
                raise NotImplementedError(
                    f"{self!r} has no NumPy dtype here ({why}); use "
                    f"{self!r}.itemsize for its size and cast tiles inside the kernel"
                )
            return ml
        return np.dtype(np.float16 if self is float16 else self.np_storage)

    @property
    def torch_dtype(self):
        """The torch dtype (this package never imports torch: the caller's torch is used)."""
        return getattr(_loaded_torch(), self.torch_name)

    def __repr__(self):
        return f"nl.{self.name}"


float32 = dtype("float32", 4, "f", "float32", np.float32)
tfloat32 = dtype("tfloat32", 4, "f", "float32", np.float32, (10, -126, 3.4028235e38, True))
bfloat16 = dtype("bfloat16", 2, "f", "bfloat16", np.float32, (7, -126, 3.3895314e38, True))
float16 = dtype("float16", 2, "f", "float16", np.float32, (10, -14, 65504.0, True))
# OCP FP8: E4M3 without infinities (max 448; overflow saturates, as torch's cast does),
# E5M2 IEEE-like (max 57344; overflow is inf)
float8_e4m3 = dtype("float8_e4m3", 1, "f", "float8_e4m3fn", np.float32, (3, -6, 448.0, False))
float8_e5m2 = dtype("float8_e5m2", 1, "f", "float8_e5m2", np.float32, (2, -14, 57344.0, True))
int32 = dtype("int32", 4, "i", "int32", np.int32)
int16 = dtype("int16", 2, "i", "int16", np.int16)
int8 = dtype("int8", 1, "i", "int8", np.int8)
uint32 = dtype("uint32", 4, "u", "uint32", np.uint32)
uint16 = dtype("uint16", 2, "u", "uint16", np.uint16)
uint8 = dtype("uint8", 1, "u", "uint8", np.uint8)
bool_ = dtype("bool_", 1, "b", "bool", np.bool_)

ALL = [float32, tfloat32, bfloat16, float16, float8_e4m3, float8_e5m2, int32, int16, int8, uint32, uint16, uint8, bool_]
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool": bool_, "float": float32, "half": float16})
_FROM_TORCH = {d.torch_name: d for d in ALL if d is not tfloat32}
_FROM_TORCH.update({"float64": float32, "int64": int32})
_FROM_NUMPY = {
    np.dtype(np.float32): float32,
    np.dtype(np.float64): float32,
    np.dtype(np.float16): float16,
    np.dtype(np.int32): int32,
    np.dtype(np.int64): int32,
    np.dtype(np.int16): int16,
    np.dtype(np.int8): int8,
    np.dtype(np.uint32): uint32,
    np.dtype(np.uint16): uint16,
    np.dtype(np.uint8): uint8,
    np.dtype(np.bool_): bool_,
}


def _loaded_torch():
    """The torch module the caller imported. This package never imports torch itself: it
    only converts torch tensors it was handed, so torch is loaded whenever that is asked."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise RuntimeError("a torch dtype or tensor was asked for, but torch is not imported; import torch first")
    return torch


# The host array types AWS's NKI uses for the formats NumPy lacks (the ml_dtypes package).
_ML_NAMES = {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}


def _ml_dtype(d):
    """The ml_dtypes NumPy dtype of NKI dtype ``d`` (None: not installed, or no such type)."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    name = _ML_NAMES.get(d.name)
    return np.dtype(getattr(ml_dtypes, name)) if name else None


for _d in ALL:
    _ml = _ml_dtype(_d)
    if _ml is not None:
        _FROM_NUMPY[_ml] = _d


def as_dtype(d):
    """Accept an NKI dtype, a torch dtype, a NumPy dtype or a name."""
    if d is None or isinstance(d, dtype):
        return d
    if type(d).__module__ == "torch" and type(d).__name__ == "dtype":
        name = str(d).partition(".")[2]
        if name in _FROM_TORCH:
            return _FROM_TORCH[name]
        raise TypeError(f"NKI has no dtype matching {d}")
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    try:
        return _FROM_NUMPY[np.dtype(d)]
    except (KeyError, TypeError):
        raise TypeError(f"NKI has no dtype matching {d!r}") from None


def _round_float(a, mbits, emin, max_finite, has_inf):
    """Round float32 values to a binary float format, nearest-even, with subnormals."""
    a = np.asarray(a, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        _, e = np.frexp(a)  # a = m * 2**e, 0.5 <= |m| < 1
        q = np.ldexp(1.0, np.maximum(e - 1, emin) - mbits)  # spacing at |a|
        r = np.round(a / q) * q  # np.round rounds half to even
        over = np.abs(r) > max_finite
        r = np.where(over, np.copysign(np.inf if has_inf else max_finite, a), r)
        r = np.where(np.isfinite(a), r, a)
    return r.astype(np.float32)


def round_to(a, d):
    """Return ``a`` (array-like) rounded to dtype ``d`` in its host storage type."""
    a = np.asarray(a)
    if d.kind == "f":
        a = a.astype(np.float32, copy=False)
        if d is float32:
            return a
        if d is float16:
            with np.errstate(all="ignore"):
                return a.astype(np.float16).astype(np.float32)
        return _round_float(a, *d.fmt)
    if d.kind == "b":
        return a.astype(np.bool_)
    if a.dtype.kind == "f":
        a = np.nan_to_num(np.trunc(a))
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


# ----- bit patterns (bit-cast views and byte-addressed on-chip memory) -----------------
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _fp8_table(d):
    """float32 value of each of the 256 codes of an FP8 format (NaN codes give NaN)."""
    mbits, emin, _, has_inf = d.fmt
    ebits = 7 - mbits
    bias = 1 - emin
    codes = np.arange(256)
    sign = np.where(codes >> 7, -1.0, 1.0)
    e = (codes >> mbits) & ((1 << ebits) - 1)
    m = codes & ((1 << mbits) - 1)
    mag = np.where(e == 0, m / (1 << mbits) * 2.0**emin, (1 + m / (1 << mbits)) * 2.0 ** (e - bias))
    top = e == (1 << ebits) - 1
    if has_inf:  # IEEE-like (E5M2): top exponent is inf (m == 0) or NaN
        mag = np.where(top & (m == 0), np.inf, np.where(top, np.nan, mag))
    else:  # E4M3FN: only S.1111.111 is NaN
        mag = np.where(top & (m == (1 << mbits) - 1), np.nan, mag)
    return (sign * mag).astype(np.float32)


_FP8 = {}


def _fp8(d):
    if d.name not in _FP8:
        table = _fp8_table(d)
        ok = ~np.isnan(table)
        bits = table[ok].view(np.uint32)
        order = np.argsort(bits)
        nan_code = int(np.flatnonzero(~ok)[0] if d is float8_e4m3 else 0x7E)
        _FP8[d.name] = (table, bits[order], np.flatnonzero(ok)[order].astype(np.uint8), np.uint8(nan_code))
    return _FP8[d.name]


def to_bits(a, d):
    """The raw bit patterns (unsigned ints of ``d.itemsize`` bytes) of values already
    rounded to ``d`` (host storage, see :func:`round_to`)."""
    a = np.asarray(a)
    if d.kind == "f":
        a = np.ascontiguousarray(a, np.float32)
        if d.itemsize == 4:
            return a.view(np.uint32)
        if d is bfloat16:
            return (a.view(np.uint32) >> 16).astype(np.uint16)
        if d is float16:
            with np.errstate(all="ignore"):
                return a.astype(np.float16).view(np.uint16)
        _, bits, codes, nan_code = _fp8(d)
        u = a.view(np.uint32)
        i = np.clip(np.searchsorted(bits, u), 0, bits.size - 1)
        out = np.where(np.isnan(a), nan_code, codes[i])
        bad = ~np.isnan(a) & (bits[i] != u)
        if bad.any():
            raise ValueError(f"{a[bad].ravel()[0]!r} is not a {d!r} value (round it first)")
        return out.astype(np.uint8)
    return np.ascontiguousarray(a, d.np_storage).view(_UINT[d.itemsize])


def from_bits(u, d):
    """Values (host storage of ``d``) of raw bit patterns ``u`` (unsigned ints)."""
    u = np.ascontiguousarray(u, _UINT[d.itemsize])
    if d.kind == "f":
        if d.itemsize == 4:
            return u.view(np.float32)
        if d is bfloat16:
            return (u.astype(np.uint32) << 16).view(np.float32)
        if d is float16:
            return u.view(np.float16).astype(np.float32)
        return _fp8(d)[0][u]
    if d.kind == "b":
        return u != 0
    return u.view(d.np_storage)
