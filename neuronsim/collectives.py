"""The collectives of torch.distributed, stated once: their names, what ranks must agree on, what a
dry run knows of their results, and the shape of their time formula.

A collective reaches this project under many names: ``torch.distributed``'s functions
(``all_gather_into_tensor``), ``ProcessGroup`` methods (``_allgather_base``, and in torch 2.13
``all_gather_single``), c10d ops (``c10d::_allgather_base_``) and functional collectives
(``_c10d_functional::all_gather_into_tensor``). :func:`find` takes any of them and gives the one
:class:`Collective`. Every reader goes through it: the real run's collective check
(``torch_neuronx/distributed/hangs.py``), and in readiness the recorder, the comparison of the
ranks' sequences (desync), the dry run's value store and the time model.

**The matching rule** (one, for the real run's check and the dry run's comparison alike): two ranks
issue the same collective at the same place of a group when they agree on its canonical name, its
reduce op, and the element count and dtype of each tensor of its *agreed* argument, the one every
rank passes alike (an all-reduce's tensors, an all-gather's input, a scatter's output). Element
counts, not shapes: NCCL and gloo move elements, so ``[4, 8]`` against ``[32]`` runs, while
``[4, 8]`` against ``[4, 4]`` hangs or fails. Collectives whose arguments differ by rank on purpose
(all-to-all's splits) agree on name and dtype only.

Torch-free (``tests/neuron/test_layering.py``): names and rules only.
"""

from __future__ import annotations

import dataclasses
import enum


class Formula(enum.Enum):
    """How a collective's time grows with its bytes B and group size n (the time model's rules)."""

    RING_ALL_REDUCE = "ring all-reduce"  # 2 (n - 1) steps, each rank sends 2 (n - 1) / n * B
    RING_HALF = "ring half"  # all-gather, reduce-scatter, all-to-all: n - 1 steps, (n - 1) / n * B
    ROOTED = "rooted"  # gather, scatter: the root's link carries every other rank's share
    CHAIN = "pipelined chain"  # broadcast, reduce: n - 1 steps, the whole buffer over one link
    POINT_TO_POINT = "point to point"  # one step, the buffer
    LATENCY_ONLY = "latency only"  # a barrier: an all-reduce of nothing


class ValueRule(enum.Enum):
    """What a dry run knows of a collective's results, taking every rank to hold this rank's values."""

    REDUCE = "reduced"  # all-reduce: by its reduce op (a sum is n times this rank's value)
    GATHER = "gathered"  # each gathered part is this rank's input
    SCATTER = "own share"  # the root's list: this rank gets its own share
    UNCHANGED = "unchanged"  # broadcast: this rank's tensor as it is
    PASSED = "passed"  # point-to-point: the sender's value, not an assumption
    NONE = "not known"  # the results are forgotten


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective under all its names."""

    name: str  # canonical: torch.distributed's function name
    formula: Formula
    value_rule: ValueRule = ValueRule.NONE
    # name (normalised: see normalise) -> position of the agreed argument in that call's arguments
    # (None: nothing is agreed beyond name and dtype). Names of one collective agree on positions
    # where they collide.
    aliases: dict = dataclasses.field(default_factory=dict)
    # c10d op name -> position of its peer (a rank of its group) in the op's arguments: what the
    # recorder sees (a ProcessGroup method takes it one place earlier; functional isend/irecv name a
    # peer the recorder does not map)
    peers: dict = dataclasses.field(default_factory=dict)

    @property
    def point_to_point(self) -> bool:
        return self.formula is Formula.POINT_TO_POINT

    @property
    def agrees_on_sizes(self) -> bool:
        """Whether ranks must agree on the sizes of an argument (else on name and dtype only)."""
        return any(i is not None for i in self.aliases.values())


def _c(name, formula, rule=ValueRule.NONE, peers=None, **aliases):
    return Collective(name, formula, rule, aliases, peers or {})


# Positions: ProcessGroup methods take (outputs, inputs, opts) or (tensors, opts); c10d ops the
# same leading tensor arguments, then the group; functional collectives their input first.
COLLECTIVES = (
    _c("all_reduce", Formula.RING_ALL_REDUCE, ValueRule.REDUCE, allreduce=0, all_reduce=0),
    _c("all_reduce_coalesced", Formula.RING_ALL_REDUCE, allreduce_coalesced=0, all_reduce_coalesced=0),
    _c("broadcast", Formula.CHAIN, ValueRule.UNCHANGED, broadcast=0),
    _c("reduce", Formula.CHAIN, reduce=0),
    _c("all_gather", Formula.RING_HALF, ValueRule.GATHER, allgather=1),
    _c("all_gather_into_tensor", Formula.RING_HALF, ValueRule.GATHER,
       allgather_base=1, all_gather_single=1, all_gather_into_tensor=0, all_gather_into_tensor_out=0),
    _c("all_gather_coalesced", Formula.RING_HALF, allgather_coalesced=1),
    _c("all_gather_into_tensor_coalesced", Formula.RING_HALF,
       allgather_into_tensor_coalesced=1, all_gather_single_coalesced=1, all_gather_into_tensor_coalesced=0),
    _c("reduce_scatter", Formula.RING_HALF, reduce_scatter=0),
    _c("reduce_scatter_tensor", Formula.RING_HALF,
       reduce_scatter_base=1, reduce_scatter_single=1, reduce_scatter_tensor=0, reduce_scatter_tensor_out=0),
    _c("reduce_scatter_tensor_coalesced", Formula.RING_HALF,
       reduce_scatter_tensor_coalesced=1, reduce_scatter_single_coalesced=1),
    _c("all_to_all", Formula.RING_HALF, alltoall=None),
    _c("all_to_all_single", Formula.RING_HALF, alltoall_base=None, all_to_all_single=None, shard_dim_alltoall=None),
    _c("gather", Formula.ROOTED, ValueRule.GATHER, gather=1),
    _c("scatter", Formula.ROOTED, ValueRule.SCATTER, scatter=0),
    _c("send", Formula.POINT_TO_POINT, ValueRule.PASSED, {"send": 2}, send=None, isend=None),
    _c("recv", Formula.POINT_TO_POINT, ValueRule.PASSED, {"recv": 2},
       recv=None, irecv=None, recv_any_source=None, recv_anysource=None),
    _c("batch_isend_irecv", Formula.POINT_TO_POINT, batch_p2p_ops=None),
    _c("barrier", Formula.LATENCY_ONLY, barrier=None),
    _c("monitored_barrier", Formula.LATENCY_ONLY, monitored_barrier=None),
)  # fmt: skip

# c10d's reduce ops by the names functional collectives pass (and ReduceOp's names, lower case)
REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"})

_BY_NAME = {alias: c for c in COLLECTIVES for alias in (c.name, *c.aliases)}
_AGREED = {alias: i for c in COLLECTIVES for alias, i in c.aliases.items()}


def normalise(op: str) -> str:
    """Any spelling of a collective's op as the names here: ``c10d::_allgather_base_.default`` ->
    ``allgather_base``; a ProcessGroup method's or a function's name as it is, without underscores
    around it."""
    return op.split("::")[-1].split(".")[0].strip("_")


def find(op: str) -> Collective | None:
    """The collective `op` is (any of its names, in any spelling :func:`normalise` takes), or None."""
    return _BY_NAME.get(normalise(op))


def canonical(op: str) -> str:
    """`op`'s canonical name, or its normalised spelling when it is not a collective known here."""
    c = find(op)
    return c.name if c is not None else normalise(op)


def agreed_argument(op: str) -> int | None:
    """The position of the argument whose tensors every rank passes alike, in this call's arguments
    (None: none, or `op` is not known here)."""
    return _AGREED.get(normalise(op))


def peer_argument(op: str) -> int | None:
    """The position of a point-to-point op's peer (a rank of its group), or None."""
    c = find(op)
    return c.peers.get(normalise(op)) if c is not None else None


def signature(op: str, dtype: str, reduce_op: str | None, agreed: list) -> tuple:
    """What ranks must agree on (the matching rule of the module's docstring): the canonical name,
    the dtype of its tensors, the reduce op, and `agreed`, the (element count, dtype name) of each
    tensor of the agreed argument, which a caller passes only where :func:`agreed_argument` names one."""
    return (canonical(op), dtype, reduce_op, tuple(tuple(a) for a in agreed))
