"""State of the kernel launch being simulated: hardware, grid position, on-chip
allocator and cost ledger. The bottom of the NKI module graph above the leaf modules
(errors, dtypes, rules, cost model): it imports none of the tensor/instruction modules.
"""

import sys
import threading
import weakref

import numpy as np

from ._cost_model import CostLedger
from ._errors import NKIContextError, NKIMemoryError
from ._memory import Memory, Placement
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
        self.sbuf_peak = 0
        self.psum_peak = 0
        self._shared = []  # shared_hbm outputs, reused by every program of the grid
        self._shared_idx = 0
        # PSUM liveness, in ticks of accesses: a tile (each block of a block tensor) holds
        # its bank from its first write to its last access, as the compiler's liveness
        # analysis gives it (not while a Python name still refers to it)
        self.clock = 0
        self._psum_blocks = {}  # storage.psum_key -> [name, blocks per bank, {block: first}, {block: last}]
        self._psum_key = 0
        self._psum_dead = []  # keys of PSUM tensors that died (records dropped per program)
        self._memories = {}  # "sbuf"/"psum" -> Memory, for directly allocated tensors
        # affine/sequential loops being run (their iteration numbers), and the places that
        # direct allocations got in the first iteration (NKI's single trace of the body)
        self._loops = []
        self._traced_places = {}
        self._occurrence = {}

    # ----- on-chip allocator (freed when the tile object dies) ------------------
    def memory(self, buffer):
        """The byte-addressed SBUF or PSUM of this launch (for directly allocated tensors)."""
        if buffer not in self._memories:
            nbytes = self.hw.sbuf_partition_bytes if buffer == "sbuf" else self.hw.psum_partition_bytes
            self._memories[buffer] = Memory(self.hw.pmax, nbytes)
        return self._memories[buffer]

    def allocate(self, storage, shape, dtype, pdim, placement=None):
        buffer = storage.buffer
        instr = f"nl.ndarray(buffer=nl.{buffer})"
        check_partition(self.hw, instr, storage.name, shape, pdim)
        if placement is not None:
            self._place(storage, shape, dtype, pdim, placement)
            return
        blocks = int(np.prod(shape[:pdim], dtype=np.int64))
        tile_free = int(np.prod(shape[pdim + 1 :], dtype=np.int64)) * dtype.itemsize
        if buffer == "psum":
            check_psum_tile(self.hw, instr, storage.name, shape, dtype, pdim)
            # blocks of a block tensor pack into 2 KiB banks (a block never straddles one)
            per_bank = max(1, self.hw.psum_bank_bytes // max(tile_free, 1)) if blocks > 1 else 1
            # the compiler gives a tile (a block of a block tensor) a bank only while it is
            # live, so it is charged when accessed (see check_psum_liveness), not here
            self._psum_key += 1
            storage.psum_key = self._psum_key
            self._psum_blocks[self._psum_key] = [storage.name, per_bank, {}, {}]
            weakref.finalize(storage, self._psum_dead.append, self._psum_key)
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
            weakref.finalize(storage, self._free, nbytes)

    def traced_loop(self, r):
        """Iterate ``r`` as an ``affine_range``/``sequential_range`` loop. NKI traces such a
        body once, so a direct allocation in it is decided once: in later iterations the
        same statement gets the place it got in the first (Python state the kernel advances
        in the body, such as an address counter, does not move it)."""
        self._loops.append(0)
        try:
            for k, i in enumerate(r):
                self._loops[-1] = k
                self._occurrence.clear()
                yield i
        finally:
            self._loops.pop()

    def _traced_key(self):
        """(statement, occurrence) of the running direct allocation inside traced loops."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(__package__ + "."):
            frame = frame.f_back
        site = (None, 0) if frame is None else (frame.f_code, frame.f_lasti)
        site = site + (len(self._loops),)
        n = self._occurrence.get(site, 0)
        self._occurrence[site] = n + 1
        return site + (n,)

    def _place(self, storage, shape, dtype, pdim, placement):
        """Direct allocation: put every logical tile where ``placement.func`` says."""
        if self._loops:
            key = self._traced_key()
            traced = self._traced_places.get(key)
            if any(self._loops) and traced is not None and traced[0] == (tuple(shape), dtype.itemsize):
                storage.placement = traced[1]
                return
        self._place_new(storage, shape, dtype, pdim, placement)
        if self._loops and not any(self._loops):
            self._traced_places[key] = ((tuple(shape), dtype.itemsize), storage.placement)

    def _place_new(self, storage, shape, dtype, pdim, placement):
        buffer = storage.buffer
        where = f"nki.compiler.{buffer} allocation of '{storage.name}'"
        parts = int(shape[pdim])
        free = int(np.prod(shape[pdim + 1 :], dtype=np.int64))
        fbytes = free * dtype.itemsize
        if buffer == "psum":
            check_psum_tile(self.hw, where, storage.name, shape, dtype, pdim)
        rows, cols = [], []
        for idx in np.ndindex(*shape[:pdim]):
            idx = tuple(int(i) for i in idx)
            loc = placement.func(idx=idx, pdim_size=parts, fdim_size=fbytes)
            try:
                loc = tuple(int(v) for v in loc)
            except TypeError:
                loc = ()
            want = 3 if buffer == "psum" else 2
            if len(loc) != want:
                raise NKIMemoryError(
                    f"{where}: the allocation function must return "
                    f"{'(bank, start_partition, byte_addr)' if want == 3 else '(start_partition, byte_addr)'} "
                    f"for tile {idx}, got {loc!r}"
                )
            if buffer == "psum":
                bank, part, addr = loc
                if not 0 <= bank < self.hw.psum_num_banks:
                    raise NKIMemoryError(
                        f"{where}: tile {idx} is placed in PSUM bank {bank}; {self.hw.name} has banks "
                        f"0..{self.hw.psum_num_banks - 1}"
                    )
                if part != 0 or addr != 0:
                    raise NKIMemoryError(
                        f"{where}: tile {idx} starts at partition {part}, byte {addr} of bank {bank}; a "
                        f"PSUM tile must start at partition 0, byte 0 of its bank (one tile per bank)"
                    )
                col = bank * self.hw.psum_bank_bytes
            else:
                part, col = loc
                cap = self.hw.sbuf_partition_bytes
                if col < 0 or col + fbytes > cap:
                    raise NKIMemoryError(
                        f"{where}: tile {idx} at byte {col} with {fbytes} bytes per partition does not fit "
                        f"in SBUF: {cap} bytes per partition ({self.hw.sbuf_bytes // (1024 * 1024)} MiB "
                        f"SBUF per core on {self.hw.name})"
                    )
            allowed = 0 if parts > 64 else 64 if parts > 32 else 32
            if part < 0 or part % max(allowed, 1) or (allowed == 0 and part) or part + parts > self.hw.pmax:
                raise NKIMemoryError(
                    f"{where}: tile {idx} of {parts} partitions cannot start at partition {part}: a tile of "
                    f"more than 64 partitions starts at 0, of 33..64 at 0 or 64, of up to 32 at a "
                    f"multiple of 32"
                )
            rows.append(part)
            cols.append(col)
        tile = parts * free
        storage.placement = Placement(self.memory(buffer), rows, cols, tile, free, dtype.itemsize)

    def release_transient(self, storage):
        """An instruction's result tile that it wrote straight into its ``dst``: the
        hardware never held it, so it holds no PSUM."""
        self._psum_blocks.pop(storage.psum_key, None)
        storage.psum_key = None

    def _free(self, nbytes):
        self.sbuf_live -= nbytes

    def touch_psum_blocks(self, key, lo, hi, write):
        """An access to blocks ``lo..hi`` of the PSUM tensor registered as ``key``."""
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

        Called when a program ends (lifetimes are known only then); clears the records
        for the next program of the grid.
        """
        self.clock += 1
        events = []  # (time, order, key, delta): removals (order 0) before additions
        for sid, (_, _, first, last) in self._psum_blocks.items():
            for b, t0 in first.items():
                events.append((t0, 1, sid, 1))
                events.append((last[b] + 1, 0, sid, -1))
        blocked = {k: (v[0], v[1]) for k, v in self._psum_blocks.items()}  # name, blocks per bank
        dead, self._psum_dead = set(self._psum_dead), []
        self._psum_blocks = {k: [v[0], v[1], {}, {}] for k, v in self._psum_blocks.items() if k not in dead}

        def banks(key, n):
            return -(-n // blocked[key][1])

        live, total, peak, worst = {}, 0, 0, None
        events.sort(key=lambda e: (e[0], e[1]))
        for i, (t, _, key, delta) in enumerate(events):
            before = banks(key, live.get(key, 0))
            live[key] = live.get(key, 0) + delta
            total += banks(key, live[key]) - before
            if (i + 1 == len(events) or events[i + 1][0] != t) and total > peak:
                peak = total
                if total > self.hw.psum_num_banks:  # name what is live at the peak
                    worst = {k: n for k, n in live.items() if banks(k, n) > 0}
        self.psum_peak = max(self.psum_peak, peak)
        if worst is not None:
            names = ", ".join(f"'{blocked[k][0]}'" + (f" ({n} blocks)" if n > 1 else "") for k, n in worst.items())
            raise NKIMemoryError(
                f"PSUM capacity exceeded: {peak} banks live at once > {self.hw.psum_num_banks} banks "
                f"of {self.hw.psum_bank_bytes} bytes per partition ({self.hw.psum_bytes // 1024} KiB "
                f"PSUM per core on {self.hw.name}); live: {names}. A PSUM tile (a block of a block "
                f"tensor) holds a bank from its first write to its last access"
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
