"""Time of one collective on Trainium: the time model's rules for NeuronLink and EFA.

The published figures (link bandwidths, the runtime's algorithm thresholds and its hop latency
range) live in neuronsim/hardware.py; the choices this model makes among them, and the
reasoning for each, live here. The report's assumptions are written from these constants.
"""

from __future__ import annotations

from neuronsim import collectives as _collectives
from neuronsim import hardware as hw
from neuronsim.collectives import Formula

# Latency of one ring step. AWS's nccom-test examples (older hardware, marked "not up to date")
# show tens of microseconds for a 1 KiB all-reduce on 2 ranks and a ~300 us floor on 16 ranks. A
# ring all-reduce takes 2 (n - 1) steps, so 10 us per step matches both: 20 us at n = 2 and 300 us
# at n = 16. A choice of this model, not a published figure.
RING_STEP_LATENCY_S = 10e-6

# What a rank can send: AWS states chip-to-chip link figures as the sum over a chip's links of
# both directions (see hardware.Chip.neuronlink_bytes_per_s), and a ring sends one way on
# each link it uses ("multiple cycles with mutually exclusive wires in parallel", Intra-node
# Collective Communications). So a rank's ring bandwidth is half its share of the chip's figure.
# A check against AWS's nccom-test guide (its 16-rank all-reduce sweep picks KangaRing, a
# Trainium2 algorithm): at 32 MiB and 512 MiB it took 2.75 and 9.69 ms; with half the figure that
# leaves about 2 ms of latency at both sizes (2.3 and 1.8 ms), with the whole figure 2.5 and 5.8.
NEURONLINK_SEND_SHARE = 0.5

# Per-hop latency inside one trn2/trn3 instance: AWS gives "about 1-2 us (HBM load dependent)";
# the upper end is used, as every hop of a tensor-parallel all-reduce waits on HBM that the layer
# is also reading.
INTRANODE_HOP_LATENCY_S = hw.INTRANODE_HOP_LATENCY_RANGE_S[1]


def _ring_all_reduce(n, b):
    return 2 * (n - 1), 2 * (n - 1) / n * b


def _ring_half(n, b):  # all-gather, reduce-scatter, all-to-all: b is the whole (gathered) buffer
    return n - 1, (n - 1) / n * b


def _pipelined_chain(n, b):  # broadcast and reduce: the buffer flows down a chain in pieces
    return n - 1, b


def _point_to_point(n, b):
    return 1, b


def _latency_only(n, b):  # a barrier: an all-reduce of nothing
    return 2 * (n - 1), 0


# How each formula of the vocabulary (neuronsim.collectives.Formula) counts: (ring steps, bytes each
# rank sends) for n ranks and B bytes. Gather and scatter: the root's link carries every other
# rank's share, as in an all-gather.
FORMULAS = {
    Formula.RING_ALL_REDUCE: _ring_all_reduce,
    Formula.RING_HALF: _ring_half,
    Formula.ROOTED: _ring_half,
    Formula.CHAIN: _pipelined_chain,
    Formula.POINT_TO_POINT: _point_to_point,
    Formula.LATENCY_ONLY: _latency_only,
}
# The formulas AWS's intra-node page describes (the runtime's Mesh / RDH / KangaRing choice).
_INTRANODE = (Formula.RING_ALL_REDUCE, Formula.RING_HALF)


def is_approximated(kind: str) -> bool:
    """True for a collective this model has no formula for (it is timed as an all-gather)."""
    return _collectives.find(kind) is None


def _formula(kind: str):
    """The collective's formula; one the vocabulary does not know is timed as an all-gather."""
    found = _collectives.find(kind)
    return found.formula if found is not None else Formula.RING_HALF


def _intranode_hops(kind: str, nbytes: int, size: int, per_chip: int) -> int:
    """Hops of the algorithm the Neuron runtime picks for a collective inside one instance."""
    halves = 2 if _formula(kind) is Formula.RING_ALL_REDUCE else 1  # all-reduce: reduce-scatter + all-gather
    if nbytes < hw.INTRANODE_MESH_MAX_BYTES:
        return 2 * halves
    if nbytes <= hw.INTRANODE_RDH_MAX_BYTES:
        chips = max(1, -(-size // per_chip))
        return (1 + max(0, (chips - 1).bit_length())) * halves
    return max(1, (size - 1) // 2) * halves


def collective_time(fig: dict, kind: str, nbytes: int, size: int, across_instances: bool = False) -> tuple:
    """(seconds, latency part, bandwidth part) of one collective; `across_instances` when its
    group's ranks are on different instances (it then runs at the rank's share of EFA)."""
    if size <= 1:
        return 0.0, 0.0, 0.0
    formula = _formula(kind)
    steps, sent = FORMULAS[formula](size, nbytes)
    lat = steps * RING_STEP_LATENCY_S
    intranode = fig.get("intranode_ranks") and size <= fig["intranode_ranks"]
    if not across_instances and intranode and formula in _INTRANODE:
        lat = _intranode_hops(kind, nbytes, size, fig["ranks_per_chip"]) * INTRANODE_HOP_LATENCY_S
    if across_instances and fig.get("efa_bytes_per_s") is None:
        raise hw.MissingFigure(f"no estimate across instances for {fig['chip']}: the instance has no EFA figure")
    bw = sent / (fig["efa_bytes_per_s"] if across_instances else fig["link_bytes_per_s"])
    return lat + bw, lat, bw


def assumptions() -> list:
    """The report's lines on collectives, written from the constants above."""
    us = 1e6
    lo, hi = (x * us for x in hw.INTRANODE_HOP_LATENCY_RANGE_S)
    return [
        f"collectives: ring algorithm, {RING_STEP_LATENCY_S * us:g} us per ring step (chosen to match AWS's "
        "published nccom-test latencies), each rank's ring bandwidth its logical core's share of what the "
        f"chip's NeuronLink links carry one way: {NEURONLINK_SEND_SHARE:g} of the published per-chip figure, "
        "which counts both directions.",
        "collectives inside one trn2/trn3 instance: the latency of the algorithm AWS's runtime picks by "
        f"size (Mesh below {hw.INTRANODE_MESH_MAX_BYTES >> 20} MB: 2 hops per reduce-scatter or all-gather; "
        f"RDH to {hw.INTRANODE_RDH_MAX_BYTES >> 20} MB: 1 + log2(chips) hops; KangaRing above: half a ring's), "
        f"{INTRANODE_HOP_LATENCY_S * us:g} us per hop (AWS: about {lo:g}-{hi:g} us); bandwidth as a ring.",
        "collectives between instances (a group whose ranks sit on different instances): the same "
        "ring, each rank's bandwidth its share of the instance's published EFA bandwidth (trn1.32xlarge: "
        "800 Gbps over 32 cores).",
        "broadcast and reduce: a pipelined chain (n - 1 steps of latency, the whole buffer over one link); "
        "gather and scatter: the root's link carries every other rank's share; send and receive: one step "
        "and the buffer; a barrier: an all-reduce's latency. A collective with no formula here is timed as "
        "an all-gather of its bytes, and the report lists it as approximated.",
    ]
