"""State of the kernel launch being simulated: hardware, grid position, on-chip
allocator and cost ledger. The bottom of the NKI module graph above the leaf modules
(errors, dtypes, rules, cost model): it imports none of the tensor/instruction modules.
"""

import threading
import weakref

import numpy as np

from ._cost_model import CostLedger
from ._errors import NKIContextError, NKIMemoryError
from ._rules import check_partition, check_psum_tile

_state = threading.local()


def current_run(required=True):
    """The kernel launch being simulated on this thread."""
    run = getattr(_state, "run", None)
    if run is None and required:
        raise NKIContextError(
            "this NKI API must be called inside a running @nki.jit kernel "
            "(call the kernel, or use nki.simulate(kernel)(...))"
        )
    return run


def set_run(run):
    """Make ``run`` the current launch; return the previous one (to restore)."""
    prev = getattr(_state, "run", None)
    _state.run = run
    return prev


class KernelRun:
    """State of one kernel launch: hardware, grid position, allocator, cost ledger."""

    def __init__(self, hw, grid):
        self.hw = hw
        self.grid = grid
        self.program_id = (0,) * len(grid)
        self.ledger = CostLedger(hw)
        self.sbuf_live = 0  # bytes per partition
        self.psum_live = 0  # banks
        self.sbuf_peak = 0
        self.psum_peak = 0
        self._shared = []  # shared_hbm outputs, reused by every program of the grid
        self._shared_idx = 0

    # ----- on-chip allocator (freed when the tile object dies) ------------------
    def allocate(self, storage, shape, dtype, pdim):
        buffer = storage.buffer
        instr = f"nl.ndarray(buffer=nl.{buffer})"
        check_partition(self.hw, instr, storage.name, shape, pdim)
        blocks = int(np.prod(shape[:pdim], dtype=np.int64))
        tile_free = int(np.prod(shape[pdim + 1 :], dtype=np.int64)) * dtype.itemsize
        if buffer == "psum":
            check_psum_tile(self.hw, instr, storage.name, shape, dtype, pdim)
            # blocks of a block tensor pack into 2 KiB banks (a block never straddles one)
            per_bank = max(1, self.hw.psum_bank_bytes // max(tile_free, 1))
            banks = -(-blocks // per_bank)
            if self.psum_live + banks > self.hw.psum_num_banks:
                raise NKIMemoryError(
                    f"{instr}: operand '{storage.name}': PSUM capacity exceeded: "
                    f"{self.psum_live} banks live + {banks} requested > "
                    f"{self.hw.psum_num_banks} banks of {self.hw.psum_bank_bytes} bytes per "
                    f"partition ({self.hw.psum_bytes // 1024} KiB PSUM per core on {self.hw.name})"
                )
            self.psum_live += banks
            self.psum_peak = max(self.psum_peak, self.psum_live)
            weakref.finalize(storage, self._free, "psum", banks)
        else:
            nbytes = blocks * tile_free
            cap = self.hw.sbuf_partition_bytes
            if self.sbuf_live + nbytes > cap:
                raise NKIMemoryError(
                    f"{instr}: operand '{storage.name}': SBUF capacity exceeded: "
                    f"{self.sbuf_live} + {nbytes} bytes per partition > {cap} bytes per "
                    f"partition ({self.hw.sbuf_bytes // (1024 * 1024)} MiB SBUF per core on "
                    f"{self.hw.name})"
                )
            self.sbuf_live += nbytes
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            weakref.finalize(storage, self._free, "sbuf", nbytes)

    def _free(self, kind, amount):
        if kind == "psum":
            self.psum_live -= amount
        else:
            self.sbuf_live -= amount

    def shared_output(self, factory, shape, dtype):
        """All programs of a grid share ``nl.shared_hbm`` outputs (matched by order)."""
        if self._shared_idx < len(self._shared):
            t = self._shared[self._shared_idx]
            if t.shape != tuple(shape) or t.dtype is not dtype:
                raise NKIContextError(
                    "programs of one grid allocated different shared_hbm outputs "
                    f"({t.shape} {t.dtype!r} vs {tuple(shape)} {dtype!r})"
                )
        else:
            t = factory()
            self._shared.append(t)
        self._shared_idx += 1
        return t
