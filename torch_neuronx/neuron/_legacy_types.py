"""Legacy type objects of the device: ``torch.neuron.FloatTensor``,
``torch.neuron.FloatStorage`` and the other dtypes, as ``torch.cuda`` has them.

``Tensor.type()`` names ``torch.neuron.<T>Tensor``, ``Tensor.storage_type()``
looks ``<T>Storage`` up in ``torch.neuron``, and ``Tensor.type(cls)`` parses
the type's C-level name, so each tensor type is named in full.
"""

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

# The dtypes torch.cuda has legacy tensor types for (no complex, no quantized).
_TENSOR_TYPES = {
    "DoubleTensor": torch.float64,
    "FloatTensor": torch.float32,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "LongTensor": torch.int64,
    "IntTensor": torch.int32,
    "ShortTensor": torch.int16,
    "CharTensor": torch.int8,
    "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}

# torch.cuda's storage types: the tensor dtypes and the two complex ones.
_STORAGE_TYPES = {name.replace("Tensor", "Storage"): dtype for name, dtype in _TENSOR_TYPES.items()} | {
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}

_MODULE = "torch.neuron"


class _NeuronTensorType(type):
    """Metaclass of the legacy tensor types: isinstance checks device and dtype
    (as torch.tensortype does), and calling one makes a neuron tensor."""

    def __instancecheck__(cls, obj):
        return (
            isinstance(obj, torch.Tensor)
            and obj.device.type == "neuron"
            and obj.layout == torch.strided
            and obj.dtype == cls.dtype
        )

    def __call__(cls, *args, device=None):
        # The legacy constructor: () or sizes -> uninitialised, a sequence ->
        # its data; as torch.FloatTensor does on CPU.
        device = torch.device("neuron" if device is None else device)
        if device.type != "neuron":
            raise RuntimeError(f"{cls.__qualname__}: expected a neuron device, got {device}")
        if len(args) == 1 and isinstance(args[0], torch.Size):
            args = tuple(args[0])
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=cls.dtype, device=device)
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=device)
        raise TypeError(
            f"{_MODULE}.{cls.__qualname__}() takes sizes (ints or a torch.Size) or one sequence of data, "
            f"got {tuple(type(a).__name__ for a in args)}"
        )


def _tensor_type(name, dtype):
    cls = _NeuronTensorType(
        name,
        (),
        {"dtype": dtype, "is_cuda": False, "is_sparse": False, "layout": torch.strided, "__module__": _MODULE},
    )
    # Tensor.type(cls) reads the C-level type name, which for a Python class
    # is __name__; __qualname__ keeps repr and pickling right.
    cls.__name__ = f"{_MODULE}.{name}"
    cls.__qualname__ = name
    return cls


class _NeuronLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for neuron storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for neuron storage")


def _storage_type(name, dtype):
    def _dtype(cls):
        return dtype

    def public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    # TypedStorage finds the device of a legacy storage class from its module.
    return type(
        name,
        (_NeuronLegacyStorage,),
        {"_dtype": classproperty(_dtype), "dtype": classproperty(public_dtype), "__module__": _MODULE},
    )


def _make_all():
    out = {name: _tensor_type(name, dtype) for name, dtype in _TENSOR_TYPES.items()}
    out.update({name: _storage_type(name, dtype) for name, dtype in _STORAGE_TYPES.items()})
    return out


LEGACY_TYPES = _make_all()
