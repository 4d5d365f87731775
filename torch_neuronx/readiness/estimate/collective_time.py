"""Time of one collective on Trainium, from AWS's measured collective times where there are some.

AWS publishes measured collective times only as nccom-test examples (neuronsim.measured): a
collective's time by message size, for one chip generation, rank count and SDK release. They
disagree with each other (a 32-rank 1 KiB all-gather on trn1: 151 us at SDK 2.10, 6.16 us at
2.24) and with the runtime page's description (1-2 us per hop: about 8 us for a small
all-reduce). A measurement outranks a description; of the measurements, the one taken under the
conditions nearest the collective timed, in the order in which they move the measured times most:

1. the same chip generation, inside one instance or across instances as the group is (across:
   with as many ranks on each instance, since the runtime's hierarchical algorithms reduce on
   NeuronLink first and cross EFA with a fraction of the bytes);
2. a sweep that measured the size (larger than all: the one that measured the most bytes per rank);
3. the latest SDK release: the runtime's release notes cut collective latency release after
   release, and the same example's floor fell 25x from 2.10 to 2.24;
4. the same kind (an all-reduce; an all-gather for the others), else the other kind, an all-reduce
   being a reduce-scatter and an all-gather (twice an all-gather's time, as the runtime page
   builds its hierarchical all-reduce);
5. the nearest rank count, then a sweep run alone over one that ran beside another stream (an
   upper bound of the time alone).

Its time for B bytes over n ranks is the sweep's at the same bytes per rank (B (n - 1) / n against
the sweep's size at its rank count), linear between measured sizes; below the smallest size it is
the smallest's (the floor: the latency term); above the largest, the chip's highest measured bus
bandwidth carries the rest. Without a sweep (point-to-point transfers, trn3, groups across
instances of another shape), AWS's description times it: see ``_described``.
"""

from __future__ import annotations

import bisect
import math

from neuronsim import collectives as _collectives
from neuronsim import hardware as hw
from neuronsim import measured as _measured
from neuronsim.collectives import Formula

# What a rank can send: AWS states chip-to-chip link figures as the sum over a chip's links of
# both directions (see hardware.Chip.neuronlink_bytes_per_s), and a ring sends one way on
# each link it uses ("multiple cycles with mutually exclusive wires in parallel", Intra-node
# Collective Communications). So a rank's ring bandwidth is half its share of the chip's figure.
NEURONLINK_SEND_SHARE = 0.5

# Per-hop latency inside one trn2/trn3 instance where no sweep is measured: AWS gives "about 1-2 us
# (HBM load dependent)"; the upper end is used, as every hop of a tensor-parallel all-reduce waits
# on HBM that the layer is also reading.
INTRANODE_HOP_LATENCY_S = hw.INTRANODE_HOP_LATENCY_RANGE_S[1]

_KIND_OF = {  # the vocabulary's formula -> the kind of sweep that times it
    Formula.RING_ALL_REDUCE: "all_reduce",
    Formula.LATENCY_ONLY: "all_reduce",  # a barrier: an all-reduce of nothing
    Formula.RING_HALF: "all_gather",
    Formula.ROOTED: "all_gather",
    Formula.CHAIN: "all_gather",  # broadcast, reduce: every rank receives (or sends) the buffer once
}


def is_approximated(kind: str) -> bool:
    """True for a collective this model has no formula for (it is timed as an all-gather)."""
    return _collectives.find(kind) is None


def _formula(kind: str):
    """The collective's formula; one the vocabulary does not know is timed as an all-gather."""
    found = _collectives.find(kind)
    return found.formula if found is not None else Formula.RING_HALF


def _bus_factor(kind: str, n: int) -> float:
    """nccom-test's bus bandwidth factor: the bytes each rank sends per byte of the collective."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def _release(sweep) -> tuple:
    return tuple(int(x) for x in sweep.sdk.split("."))


def _same_traffic(nbytes: float, size: int, sweep) -> float:
    """The sweep's size at which each rank moves what `nbytes` over `size` ranks does:
    B (n - 1) / n = S (m - 1) / m."""
    return nbytes * ((size - 1) / size) / ((sweep.ranks - 1) / sweep.ranks)


def sweep_for(chip: str, kind: str, size: int, instances: int = 1, nbytes: int = 0):
    """The nccom-test sweep that times a `kind` collective ("all_reduce" or "all_gather") of
    `nbytes` over `size` ranks on `instances` instances of `chip`, by the rule above; None where
    none applies."""
    per_instance = size / instances
    usable = [
        s
        for s in _measured.COLLECTIVE_SWEEPS
        if s.chip == chip and (s.instances > 1) == (instances > 1)
        and (instances == 1 or s.ranks / s.instances == per_instance)
    ]  # fmt: skip
    if not usable:
        return None
    covering = [s for s in usable if _same_traffic(nbytes, size, s) <= s.points[-1][0]]
    if not covering:  # larger than every sweep: the one that measured the most bytes per rank
        covering = [max(usable, key=lambda s: s.points[-1][0] * (s.ranks - 1) / s.ranks)]
    return min(
        covering,
        key=lambda s: ([-v for v in _release(s)], s.op != kind, abs(math.log2(s.ranks / size)), not s.alone),
    )


def _peak_bus_bytes_per_s(chip: str, across: bool) -> float:
    """The highest bus bandwidth measured for `chip` (inside an instance, or across): each one-stream
    sweep's at its largest size, which is where a sweep comes closest to its links' rate."""
    rates = [
        s.points[-1][0] * _bus_factor(s.op, s.ranks) / (s.points[-1][1] * 1e-6)
        for s in _measured.COLLECTIVE_SWEEPS
        if s.chip == chip and (s.instances > 1) == across
    ]
    return max(rates)


def _read(sweep, nbytes: float) -> float:
    """The sweep's seconds at `nbytes` (its own size measure): linear between measured sizes, the
    floor below, the chip's peak bus bandwidth beyond."""
    sizes = [b for b, _ in sweep.points]
    us = [t for _, t in sweep.points]
    if nbytes <= sizes[0]:
        return us[0] * 1e-6
    if nbytes >= sizes[-1]:
        rate = _peak_bus_bytes_per_s(sweep.chip, sweep.instances > 1)
        return us[-1] * 1e-6 + (nbytes - sizes[-1]) * _bus_factor(sweep.op, sweep.ranks) / rate
    i = bisect.bisect_left(sizes, nbytes)
    f = (nbytes - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
    return (us[i - 1] + f * (us[i] - us[i - 1])) * 1e-6


def measured_time(sweep, kind: str, nbytes: int, size: int) -> tuple:
    """(seconds, latency part) of a `kind` collective of `nbytes` over `size` ranks, read off `sweep`."""
    times = 1.0 if sweep.op == kind else (2.0 if kind == "all_reduce" else 0.5)
    return times * _read(sweep, _same_traffic(nbytes, size, sweep)), times * sweep.floor_s


def _ring_steps(formula, n: int) -> int:
    """Steps of latency of AWS's ring (and chain) algorithms, the description's fallback."""
    return {Formula.RING_ALL_REDUCE: 2 * (n - 1), Formula.LATENCY_ONLY: 2 * (n - 1), Formula.POINT_TO_POINT: 1}.get(
        formula, n - 1
    )


def _sent(formula, n: int, b: int) -> float:
    """Bytes each rank sends (the root's link, for gather and scatter), by the formula."""
    if formula is Formula.RING_ALL_REDUCE:
        return 2 * (n - 1) / n * b
    if formula in (Formula.RING_HALF, Formula.ROOTED):
        return (n - 1) / n * b
    return 0 if formula is Formula.LATENCY_ONLY else b


def _intranode_hops(formula, nbytes: int, size: int, per_chip: int) -> int:
    """Hops of the algorithm the Neuron runtime picks for a collective inside one instance."""
    halves = 2 if formula is Formula.RING_ALL_REDUCE else 1  # all-reduce: reduce-scatter + all-gather
    if nbytes < hw.INTRANODE_MESH_MAX_BYTES:
        return 2 * halves
    if nbytes <= hw.INTRANODE_RDH_MAX_BYTES:
        chips = max(1, -(-size // per_chip))
        return (1 + max(0, (chips - 1).bit_length())) * halves
    return max(1, (size - 1) // 2) * halves


def _described(fig: dict, formula, nbytes: int, size: int, across: bool) -> tuple:
    """(latency, bandwidth) by AWS's description where no sweep applies: across instances a ring
    over EFA, each hop the measured ~15 us of one RDMA packet (ib_write_lat), at the rank's share
    of the instance's EFA; inside one, the runtime's algorithm by size (Mesh, RDH, KangaRing) for
    the collectives its page describes, else a ring, at the published 1-2 us per hop."""
    if across:
        if fig.get("efa_bytes_per_s") is None:
            raise hw.MissingFigure(f"no estimate across instances for {fig['chip']}: the instance has no EFA figure")
        return _ring_steps(formula, size) * _measured.EFA_HOP_LATENCY_S, _sent(formula, size, nbytes) / fig[
            "efa_bytes_per_s"
        ]
    hops = _ring_steps(formula, size)
    described = formula in (Formula.RING_ALL_REDUCE, Formula.RING_HALF)
    if described and fig.get("intranode_ranks") and size <= fig["intranode_ranks"]:
        hops = _intranode_hops(formula, nbytes, size, fig["ranks_per_chip"])
    return hops * INTRANODE_HOP_LATENCY_S, _sent(formula, size, nbytes) / fig["link_bytes_per_s"]


def collective_time(fig: dict, kind: str, nbytes: int, size: int, instances: int = 1) -> tuple:
    """(seconds, latency part, bandwidth part) of one collective over `size` ranks on `instances`
    instances of `fig`'s chip."""
    if size <= 1:
        return 0.0, 0.0, 0.0
    formula = _formula(kind)
    sweep_kind = _KIND_OF.get(formula)
    payload = 0 if formula is Formula.LATENCY_ONLY else nbytes
    sweep = sweep_for(fig["chip"], sweep_kind, size, instances, payload) if sweep_kind else None
    if sweep is None:
        lat, bw = _described(fig, formula, nbytes, size, instances > 1)
        return lat + bw, lat, bw
    seconds, lat = measured_time(sweep, sweep_kind, payload, size)
    return seconds, lat, seconds - lat


def _sweep_line(s) -> str:
    return f"{s.chip} {s.op.replace('_', '-')} of {s.ranks} ranks{' on %d instances' % s.instances if s.instances > 1 else ''} (SDK {s.sdk}, {s.floor_s * 1e6:g} us floor)"


def assumptions() -> list:
    """The report's lines on collectives, written from the measurements and the rule above."""
    used = sorted(
        {
            _sweep_line(s)
            for s in _measured.COLLECTIVE_SWEEPS
            for b, _ in s.points
            if any(sweep_for(s.chip, k, s.ranks, s.instances, b) is s for k in ("all_reduce", "all_gather"))
        }
    )
    lo, hi = (x * 1e6 for x in hw.INTRANODE_HOP_LATENCY_RANGE_S)
    return [
        "collectives: read off AWS's measured nccom-test sweeps (examples AWS marks as not up to date): of "
        "those of the same chip and scope (inside one instance, or across with as many ranks on each) that "
        "measured the size, the latest SDK release's, of the same kind (all-reduce; all-gather for the others; "
        "an all-reduce twice an all-gather where only that is measured), at the nearest rank count; at the "
        "same bytes per rank, linear between measured sizes, the smallest size's time below (the latency "
        f"term), the chip's highest measured bus bandwidth beyond. Used: {'; '.join(used)}.",
        "collectives without a measurement (trn3; point-to-point transfers; groups across instances of another "
        "shape): by AWS's description, across instances a ring over EFA at the measured ~15 us per hop "
        "(ib_write_lat) and the rank's share of the instance's EFA bandwidth; inside one the runtime's "
        f"algorithm by size (Mesh below {hw.INTRANODE_MESH_MAX_BYTES >> 20} MB, RDH to "
        f"{hw.INTRANODE_RDH_MAX_BYTES >> 20} MB, KangaRing above) or a ring, at {hi:g} us per hop (AWS: about "
        f"{lo:g}-{hi:g} us), bytes at the rank's share of what the chip's NeuronLink carries one way.",
        "A collective with no formula here is timed as an all-gather of its bytes, and the report lists it as "
        "approximated.",
    ]
