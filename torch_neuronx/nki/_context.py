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
        # PSUM liveness, in ticks of accesses: plain tiles hold their banks from allocation
        # to death; each block of a block tensor from its first write to its last access
        self.clock = 0
        self._psum_plain = []  # [name, banks, start, end (None while alive)]
        self._psum_blocks = {}  # storage.psum_key -> [name, blocks per bank, {block: first}, {block: last}]
        self._psum_key = 0
        self._plain_record = weakref.WeakKeyDictionary()  # storage -> its _psum_plain record

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
            if blocks > 1:
                # the block dimension is logical: the compiler gives a block physical banks
                # only while it is live, so blocks are charged when accessed (see
                # check_psum_liveness), not here
                self._psum_key += 1
                storage.psum_key = self._psum_key
                self._psum_blocks[self._psum_key] = [storage.name, per_bank, {}, {}]
                return
            self.clock += 1
            banks = 1
            if self.psum_live + banks > self.hw.psum_num_banks:
                raise NKIMemoryError(
                    f"{instr}: operand '{storage.name}': PSUM capacity exceeded: "
                    f"{self.psum_live} banks live + {banks} requested > "
                    f"{self.hw.psum_num_banks} banks of {self.hw.psum_bank_bytes} bytes per "
                    f"partition ({self.hw.psum_bytes // 1024} KiB PSUM per core on {self.hw.name})"
                )
            self.psum_live += banks
            self.psum_peak = max(self.psum_peak, self.psum_live)
            record = [storage.name, banks, self.clock, None]
            self._psum_plain.append(record)
            self._plain_record[storage] = record
            weakref.finalize(storage, self._free, "psum", banks, record)
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

    def release_transient(self, storage):
        """An instruction's result tile that it wrote straight into its ``dst``: the
        hardware never held it, so it holds no PSUM."""
        record = self._plain_record.get(storage)
        if record is not None:
            self.psum_live -= record[1]
            record[1] = 0

    def _free(self, kind, amount, record=None):
        if kind == "psum":
            self.psum_live -= record[1]
            self.clock += 1
            record[3] = self.clock
        else:
            self.sbuf_live -= amount

    def touch_psum_blocks(self, key, lo, hi, write):
        """An access to blocks ``lo..hi`` of the PSUM block tensor registered as ``key``."""
        rec = self._psum_blocks.get(key)
        if rec is None:
            return
        self.clock += 1
        first, last = rec[2], rec[3]
        for b in range(lo, hi + 1):
            if write:
                first.setdefault(b, self.clock)
            if b in first:
                last[b] = self.clock

    def check_psum_liveness(self):
        """Raise NKIMemoryError if more PSUM banks than exist were live at one time.

        Called when a program ends (block lifetimes are known only then); clears the
        records for the next program of the grid.
        """
        self.clock += 1
        events = []  # (time, order, key, delta): removals (order 0) before additions
        plain = {}
        for i, (name, banks, start, end) in enumerate(self._psum_plain):
            key = ("plain", i)
            plain[key] = (name, banks)
            events.append((start, 1, key, 1))
            events.append(((self.clock if end is None else end) + 1, 0, key, -1))
        for sid, (_, _, first, last) in self._psum_blocks.items():
            for b, t0 in first.items():
                events.append((t0, 1, sid, 1))
                events.append((last[b] + 1, 0, sid, -1))
        self._psum_plain = [r for r in self._psum_plain if r[3] is None]
        for r in self._psum_plain:
            r[2] = self.clock
        blocked = {k: (v[0], v[1]) for k, v in self._psum_blocks.items()}  # name, blocks per bank
        self._psum_blocks = {k: [v[0], v[1], {}, {}] for k, v in self._psum_blocks.items()}

        def banks(key, n):
            return plain[key][1] * n if key in plain else -(-n // blocked[key][1])

        live, total, peak, worst = {}, 0, 0, None
        events.sort(key=lambda e: (e[0], e[1]))
        for i, (t, _, key, delta) in enumerate(events):
            before = banks(key, live.get(key, 0))
            live[key] = live.get(key, 0) + delta
            total += banks(key, live[key]) - before
            if (i + 1 == len(events) or events[i + 1][0] != t) and total > peak:
                peak = total
                if total > self.hw.psum_num_banks and worst is None:
                    worst = {k: n for k, n in live.items() if banks(k, n) > 0}
        self.psum_peak = max(self.psum_peak, peak)
        if worst is not None:
            names = ", ".join(
                f"'{plain[k][0]}'" if k in plain else f"'{blocked[k][0]}' ({n} blocks)" for k, n in worst.items()
            )
            raise NKIMemoryError(
                f"PSUM capacity exceeded: {peak} banks live at once > {self.hw.psum_num_banks} banks "
                f"of {self.hw.psum_bank_bytes} bytes per partition ({self.hw.psum_bytes // 1024} KiB "
                f"PSUM per core on {self.hw.name}); live: {names}. A block of a PSUM block tensor "
                f"holds a bank from its first write to its last access"
            )

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
