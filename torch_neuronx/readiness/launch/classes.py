"""Rank classes: the ranks of a job that do the same work, found from its device mesh and proven by
running a few of them.

Most ranks of a large job do what others do: the data-parallel replicas of a pipeline stage run the
same ops on other data, the tensor-parallel ranks of a stage the same shapes on other shards. A dry
run of the job by classes runs rank 0 first (it is always a class of its own: scripts log, save and
print there). Its process groups give the job's mesh: each dimension of a DeviceMesh is a group of
ranks in arithmetic progression (``[0, 32, 64, ...]``), and together they number every rank in mixed
radix (a job with no mesh is one dimension, the world). Rank 0's pipeline runs whole (its stages
exchange messages), and each of its ranks is a class of its own: the first rank of each pipeline
stage, where pipelined trainers log the loss the last stage computes (torchtitan's metrics rank),
is answered by its own run at no extra cost. The other ranks are grouped by their coordinates on
the dimensions that change the work: a pipeline's stages (a dimension named for it) from the
start, and ranges of any other a proof splits off. Each class runs a representative and, as
witnesses, the ranks at the far end of each other dimension (the last tensor-parallel rank, the
last data-parallel replica) and at the far corner, where uneven shards and rank branches show. A
witness whose fingerprint (:func:`fingerprint`: its collectives in order per mesh dimension, its
compiled graphs, op counts and peak memory) differs from its representative's splits the class
(``by_classes``: the coordinates that differ apart from the ranges before, between and after them:
a script that logs on one tensor-parallel rank splits one rank off, not 32), and the new classes
run in turn.
A class is proven when its witnesses agree; it is not when they never do within the runs a dry run
allows, or when values decided the run (a library's branch on a value the dry run does not have).
Every rank then has its class's answer: its memory, its collectives, its time.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from neuronsim import collectives as _collectives

_CORE = re.compile(r"neuron:\d+")

# Dimensions that change what a rank runs from the start, and whose ranks exchange point-to-point
# messages a dry run must pass (so it runs them together): a pipeline's stages.
PIPELINE_DIMS = frozenset({"pp", "pipe", "pipeline", "pipeline_parallel", "stage", "stages"})
MAX_RUNS = 96  # ranks a dry run by classes runs at most (whole pipelines); beyond, the classes stay unproven


@dataclasses.dataclass(frozen=True)
class Dim:
    """One dimension of the job's mesh: `size` coordinates, `stride` ranks apart; `pipeline` when its
    ranks are a pipeline's stages (a dimension named for it, or the group a pipeline stage is built on)."""

    name: str
    size: int
    stride: int
    pipeline: bool = False


@dataclasses.dataclass(frozen=True)
class Mesh:
    """The job's ranks as a grid (dimensions by increasing stride)."""

    dims: tuple
    world: int

    def coords(self, rank: int) -> tuple:
        return tuple((rank // d.stride) % d.size for d in self.dims)

    def rank(self, coords) -> int:
        return sum(c * d.stride for c, d in zip(coords, self.dims))

    def index(self, name: str) -> int:
        return next(i for i, d in enumerate(self.dims) if d.name == name)


def infer_mesh(groups: dict, world: int, pipeline: list | None = None) -> Mesh:
    """The mesh that numbers every rank of a `world`-rank job, from rank 0's groups (name ->
    GroupLog) and its pipeline stage's group (its global ranks, or None): the groups in arithmetic
    progression from 0, by increasing stride, each stride the product of the sizes before it; the
    whole world as one dimension when they do not. The whole world is a dimension only as a
    pipeline's (a stage built on the default group, as PyTorch's pipelining tutorial does)."""
    found: dict = {}
    for g in groups.values():
        ranks, name = list(g.ranks), (g.desc or "").removeprefix("mesh_") or f"group {g.name}"
        stages = ranks == pipeline
        if len(ranks) < 2 or ranks[0] != 0 or (len(ranks) == world and not stages):
            continue
        stride = ranks[1]
        if stride > 0 and ranks == list(range(0, stride * len(ranks), stride)):
            found.setdefault((stride, len(ranks)), (name, stages or name in PIPELINE_DIMS))
    dims, product = [], 1
    for (stride, size), (name, stages) in sorted(found.items()):
        if stride == product:
            dims.append(Dim(name, size, stride, stages))
            product *= size
    if product != world:
        return Mesh((Dim("world", world, 1),), world)
    return Mesh(tuple(dims), world)


@dataclasses.dataclass
class RankClass:
    """Ranks expected to run alike: the coordinates they span (`fixed`: {dimension index: range of
    its values}, the others free), its members, and those of them a dry run runs (`runs`: the
    representative first, then the witnesses)."""

    members: list
    runs: list
    fixed: dict = dataclasses.field(default_factory=dict)
    proven: bool | None = None  # None until its runs are compared
    why: str = ""  # how it was proven, or why not
    split_because: str = ""  # why the class it came from was split

    @property
    def rep(self) -> int:
        return self.runs[0]

    @property
    def witnesses(self) -> list:
        return self.runs[1:]

    def as_data(self, mesh: Mesh) -> dict:
        return {
            "ranks": self.members,
            "size": len(self.members),
            "rep": self.rep,
            "witnesses": self.witnesses,
            "coordinates": {mesh.dims[i].name: _shown(r) for i, r in self.fixed.items()},
            "proven": self.proven,
            "why": self.why,
            "split_because": self.split_because,
        }


def _shown(r: range):
    return r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}"


def pipeline_dims(mesh: Mesh) -> list:
    """The indices of the mesh's pipeline dimensions."""
    return [i for i, d in enumerate(mesh.dims) if d.pipeline]


def _line(mesh: Mesh, coords: dict) -> list:
    """The ranks with `coords` on every dimension but the pipeline's: one pipeline, all its stages.
    A dry run runs whole pipelines, whose stages exchange their tensors' metadata and activations
    (without a pipeline dimension, a line is one rank)."""
    pipe = pipeline_dims(mesh)
    out = []
    for values in itertools.product(*(range(mesh.dims[i].size) for i in pipe)):
        full = [coords.get(i, 0) for i in range(len(mesh.dims))]
        for i, v in zip(pipe, values):
            full[i] = v
        out.append(mesh.rank(full))
    return out


def _apart(mesh: Mesh) -> list:
    """Rank 0's pipeline: ranks that are classes of their own (see the module's docstring)."""
    return _line(mesh, {})


def _class(mesh: Mesh, fixed: dict) -> RankClass | None:
    """The class of the ranks within `fixed` (dimension index -> range of values; rank 0's
    pipeline apart): its runs are its members on the base pipeline (every dimension at the low end
    of its members' coordinates), on one more per dimension they span, at the far end, and on the
    far corner; where the base pipeline is rank 0's, its first member's too unless the others
    reach every low end. The representative is the first of them."""
    span = [fixed.get(i, range(d.size)) for i, d in enumerate(mesh.dims)]
    apart = set(_apart(mesh))
    at = {r: mesh.coords(r) for r in range(mesh.world) if r not in apart}
    at = {r: c for r, c in at.items() if all(x in s for x, s in zip(c, span))}
    members = list(at)
    if not members:
        return None
    low, high = [min(c) for c in zip(*at.values())], [max(c) for c in zip(*at.values())]
    free = [i for i in range(len(mesh.dims)) if i not in pipeline_dims(mesh) and high[i] > low[i]]
    base = dict(enumerate(low))
    bases = [base] + [{**base, i: high[i]} for i in free]
    if len(free) > 1:  # and the far corner, where the job's last rank is (a script's `rank == world - 1`)
        bases.append({**base, **{i: high[i] for i in free}})
    runs = []
    for b in bases:
        runs += [r for r in _line(mesh, b) if r in at and r not in runs]
    reached = {(i, at[r][i]) for r in runs for i in free}
    if not runs or any((i, low[i]) not in reached for i in free):
        runs.insert(0, members[0])
    return RankClass(members, runs, dict(fixed))


def plan(mesh: Mesh) -> list:
    """A class of its own for each rank of rank 0's pipeline, then one class per coordinate of the
    pipeline dimensions (all free else)."""
    pipe = pipeline_dims(mesh)
    out = []
    for r in _apart(mesh):
        alone = {i: range(c, c + 1) for i, c in enumerate(mesh.coords(r))}
        why = "rank 0: run itself" if r == 0 else f"rank {r}: run itself (the first rank of its pipeline stage)"
        out.append(RankClass([r], [r], alone, True, why))
    for values in itertools.product(*(range(mesh.dims[i].size) for i in pipe)):
        c = _class(mesh, {i: range(v, v + 1) for i, v in zip(pipe, values)})
        if c is not None:
            out.append(c)
    return out


def split(mesh: Mesh, c: RankClass, dim: int, cuts=None) -> list:
    """`c` split along dimension `dim` where its representative's coordinate differs from a
    witness's: each coordinate of `cuts` (the representative's by default) a class, and the
    coordinates before, between and after them others (where a script treats one rank of a
    dimension apart, or uneven shards the edge, the rest stay one class; a further difference
    splits them again)."""
    span = c.fixed.get(dim, range(mesh.dims[dim].size))
    cuts = sorted(cuts if cuts is not None else {mesh.coords(c.rep)[dim]})
    between = [range(lo, hi) for lo, hi in zip([span[0]] + [a + 1 for a in cuts], cuts + [span[-1] + 1])]
    pieces = [range(a, a + 1) for a in cuts] + between
    parts = [part for p in pieces if len(p) and (part := _class(mesh, {**c.fixed, dim: p})) is not None]
    for part in parts:
        part.split_because = c.why
    return parts


def lines_of(mesh: Mesh, ranks) -> list:
    """Every rank of the pipelines the given ranks are on (what a dry run must run with them)."""
    pipe = pipeline_dims(mesh)
    out = set()
    for r in ranks:
        coords = mesh.coords(r)
        out.update(_line(mesh, {i: c for i, c in enumerate(coords) if i not in pipe}))
    return sorted(out)


def fingerprint(rec, mesh: Mesh) -> dict:
    """What must be equal for two ranks to be alike: per group, by its mesh dimension, its
    collectives in order (canonical op, dtype, reduce op, agreed sizes, and a peer as an offset);
    the compiled graphs; every op's calls; each core's peak memory; how the run ended."""
    collectives = {}
    for g in rec.groups.values():
        if not g.entries:  # made, never used (torchtitan builds three meshes, each with a pp group)
            continue
        key = (g.desc or f"{len(g.ranks)} ranks", len(g.ranks))
        collectives.setdefault(key, []).append(
            tuple(
                (_collectives.canonical(e.op), e.dtype, e.reduce_op, tuple(e.agreed),
                 None if e.peer is None else e.peer - rec.rank)
                for e in g.entries
            )
        )  # fmt: skip
    # Groups of one description and size in an order of their work, not of their names: names number
    # the groups in the order the job made them, so a rank's own group of a kind is named apart from
    # its neighbour's, and names sort as strings ("1410" before "2").
    collectives = {k: sorted(v, key=repr) for k, v in collectives.items()}
    ops = {}
    for b in rec.buckets:
        for call, n in b.ops.items():
            ops[(call.op, call.dtype, call.bytes)] = ops.get((call.op, call.dtype, call.bytes), 0) + n
    return {
        "collectives": collectives,
        # a graph's inputs name the rank's own core (neuron:30): alike ranks are on other cores
        "graphs": sorted(_CORE.sub("neuron", str(g.get("shapes"))) for g in rec.compile.graphs),
        "ops": ops,
        "memory": sorted((m.peak_allocated, m.peak_reserved) for m in rec.memory.values()),
        # how the run ended: the exception's type (its message names the rank's own core), and
        # the message, shown but not compared
        "error": [rec.error.split(":", 1)[0]] if rec.error else [],
        "_error_text": (rec.error or "").splitlines()[:1],
    }


def differences(a: dict, b: dict) -> list:
    """The parts of two fingerprints that differ."""
    return [k for k in a if not k.startswith("_") and a[k] != b.get(k)]


def values_decided(rec) -> list:
    """The lines where a library branched on a value the dry run did not have (taken as True):
    there, values decided what ran, and ranks with other data may run otherwise."""
    return sorted({v.site for v in rec.value_reads if v.kind == "bool (library branch)"})
