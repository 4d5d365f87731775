"""Typed errors raised by the NKI simulator.

Every error names the instruction, the operand and the hardware limit it broke,
so a kernel author can fix the kernel without reading the simulator.
"""


class NKIError(Exception):
    """Base class of every error the NKI simulator raises."""


class NKIPartitionError(NKIError, ValueError):
    """A tile's partition dimension exceeds the 128 SBUF/PSUM partitions."""


class NKITileSizeError(NKIError, ValueError):
    """A tile's free size exceeds an engine limit (PSUM bank, matmul moving/stationary)."""


class NKIMemoryError(NKIError, MemoryError):
    """Live SBUF or PSUM allocations exceed the core's capacity."""


class NKIBufferError(NKIError, ValueError):
    """An operand lives in a memory the instruction cannot access (e.g. compute on HBM)."""


class NKIDtypeError(NKIError, TypeError):
    """An engine does not accept the operand's dtype."""


class NKIShapeError(NKIError, ValueError):
    """Operand shapes do not match what the instruction requires."""


class NKIIndexError(NKIError, IndexError):
    """A tensor access reads or writes outside the tensor."""


class NKIUninitializedError(NKIError, RuntimeError):
    """An instruction read tensor elements that nothing has written yet."""


class NKIContextError(NKIError, RuntimeError):
    """A kernel-only API was used outside a running ``@nki.jit`` kernel."""


def _fail(cls, instr, operand, message):
    """Raise ``cls`` with the uniform '<instruction>: operand <name>: <message>' form."""
    raise cls(f"{instr}: operand '{operand}': {message}")
