"""``nki.compiler``: compiler directives and direct allocation.

Scheduling hints leave results unchanged (the simulator runs instructions in program
order), so they are accepted. Direct allocation (``sbuf.alloc`` / ``sbuf.mod_alloc`` /
``psum.alloc`` / ``psum.mod_alloc``) places every logical tile of a tensor at the
partition and byte address its allocation function gives: tensors whose tiles share
addresses share the same bytes, as on the hardware (a later write through one is what a
read through the other sees).
"""

import contextlib


def skip_middle_end_transformations(fn):
    """Compiler hint (skip middle-end passes): no effect on a kernel's results."""
    return fn


def no_reorder():
    """Keep instructions in program order; the simulator always executes in order."""
    return contextlib.nullcontext()


def force_auto_alloc(fn):
    """Compiler hint: ignore a kernel's direct allocations. The simulator honours them
    (they decide which tensors share bytes), so this hint has no effect here."""
    return fn


class Allocation:
    """A direct-allocation ``buffer=``: ``func(idx=, pdim_size=, fdim_size=)`` (called with
    keywords, as the compiler does, so ``functools.partial`` can bind other arguments) gives the
    physical place of logical tile ``idx`` (the block indices): ``(start_partition,
    byte_addr)`` in SBUF, ``(bank, start_partition, byte_addr)`` in PSUM."""

    def __init__(self, buffer, func):
        if not callable(func):
            raise TypeError(f"nki.compiler.{buffer}.alloc: func must be callable, got {type(func).__name__}")
        self.buffer = buffer
        self.func = func

    def __str__(self):
        return self.buffer

    def __repr__(self):
        return f"<nki.compiler.{self.buffer} direct allocation>"


def _linear(indices, tiles, base, scale):
    """Modulo placement of NKI's mod_alloc: block index ``i`` uses slot ``i % tiles``
    (missing tile counts are 1, extra block dimensions are ignored), slots laid out
    row-major ``scale`` apart from ``base``."""
    tiles = tuple(tiles) if tiles else (1,) * len(indices)
    slot = 0
    for i, n in zip(indices, tiles):
        slot = slot * int(n) + int(i) % int(n)
    for n in tiles[len(indices) :]:
        slot *= int(n)
    return base + slot * scale


def _check_tiles(name, tiles):
    tiles = tuple(tiles)
    if any(not isinstance(n, int) or n < 1 for n in tiles):
        raise ValueError(f"{name} must be a tuple of positive ints, got {tiles!r}")
    return tiles


class _Sbuf:
    def auto_alloc(self):
        """Automatic SBUF allocation (the same as ``buffer=nl.sbuf``)."""
        return "sbuf"

    def alloc(self, func):
        """Place each logical tile where ``func(idx, pdim_size, fdim_size)`` says:
        ``(start_partition, byte_addr)``."""
        return Allocation("sbuf", func)

    def mod_alloc(self, base_addr=0, *, base_partition=0, num_par_tiles=(), num_free_tiles=()):
        """Modulo allocation: logical tile ``idx`` goes to physical tile ``idx % num_*_tiles``,
        laid out from ``(base_partition, base_addr)``."""
        num_par_tiles = _check_tiles("num_par_tiles", num_par_tiles)
        num_free_tiles = _check_tiles("num_free_tiles", num_free_tiles)

        def func(idx, pdim_size, fdim_size):
            return (
                _linear(idx, num_par_tiles, base_partition, pdim_size),
                _linear(idx, num_free_tiles, base_addr, fdim_size),
            )

        return Allocation("sbuf", func)


class _Psum:
    def auto_alloc(self):
        """Automatic PSUM allocation (the same as ``buffer=nl.psum``)."""
        return "psum"

    def alloc(self, func):
        """Place each logical tile where ``func(idx, pdim_size, fdim_size)`` says:
        ``(bank, start_partition, byte_addr)``."""
        return Allocation("psum", func)

    def mod_alloc(
        self, base_addr=0, *, base_bank=0, num_bank_tiles=(), base_partition=0, num_par_tiles=(), num_free_tiles=()
    ):
        """Modulo allocation over PSUM banks: logical tile ``idx`` goes to bank
        ``base_bank + idx % num_bank_tiles`` (one tile per bank)."""
        num_bank_tiles = _check_tiles("num_bank_tiles", num_bank_tiles)
        num_par_tiles = _check_tiles("num_par_tiles", num_par_tiles)
        num_free_tiles = _check_tiles("num_free_tiles", num_free_tiles)

        def func(idx, pdim_size, fdim_size):
            return (
                _linear(idx, num_bank_tiles, base_bank, 1),
                _linear(idx, num_par_tiles, base_partition, pdim_size),
                _linear(idx, num_free_tiles, base_addr, fdim_size),
            )

        return Allocation("psum", func)


sbuf = _Sbuf()
psum = _Psum()
