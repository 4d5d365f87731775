"""The recording: what one process's run did, as typed records.

The recorder writes a :class:`Recording`; the time model, the report and the benchmarks
read it. ``to_json`` / ``from_json`` are its one serialisation (``torch-neuronx check``
merges the ranks' files; tests and benchmarks pin recordings), versioned so that a saved
recording keeps loading: version 1 is the positional layout written before these types.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
from typing import NamedTuple

from neuronsim import collectives as _collectives

# 3: OpCall and GraphPart gained tile_flops (a version-2 recording loads with 0: not known)
# 4: CollectiveCall gained asynchronous (an older recording loads with False: every collective
#    waited for where it was issued, as the time model charged them before)
# 5: no chip in the recording: OpCall and GraphPart hold their matmuls' shapes, from which the
#    time model computes each chip's tiles (versions 3-4 keep the tile_flops they recorded, with
#    trn2's tiles, the same on every chip); CollectiveEntry is written by name and holds the
#    agreed argument's sizes (older entries take them from their shapes); the recording holds
#    the weights a dry run stood in for, a pipeline-parallel run's schedule and actions, and how many
#    instances each collective's group spans (older recordings: one)
VERSION = 5


class OpCall(NamedTuple):
    """One kind of op call, as the time model sees it (the key its calls are counted under)."""

    op: str  # ATen name, e.g. "aten::mm"
    dtype: str
    kind: str  # "tensor" (Tensor Engine), "vector", "view"
    flops: int
    bytes: int  # HBM bytes moved
    operands: int  # DMA transfers: inputs and outputs
    # Tensor Engine ops: the matmuls it runs, ((m, k, n, count), ...), where its shapes say
    matmuls: tuple = ()
    # versions 3-4: the FLOPs its tiles occupied the array for with trn2's tiles (0: as flops)
    tile_flops: int = 0


class CollectiveCall(NamedTuple):
    """One kind of collective call."""

    kind: str  # c10d name without namespace and overload, e.g. "allreduce"
    dtype: str
    bytes: int
    group_size: int
    # issued with async_op=True (DDP's gradient buckets, FSDP's all-gathers and reduce-scatters,
    # a script's own): the step may run compute while it is in flight. Functional collectives
    # (DTensor's) and async_op=False ones are waited for by the next op that reads them.
    asynchronous: bool = False
    instances: int = 1  # instances (nodes) its group's ranks are on: more than one crosses EFA


class GraphPart(NamedTuple):
    """A part of one run of a compiled graph, timed like an op: a matmul-like node, or the one
    ``"fused"`` kernel of all other nodes (its flops are vector operations)."""

    kind: str
    dtype: str
    flops: int
    bytes: int
    operands: int
    matmuls: tuple = ()  # as OpCall's
    tile_flops: int = 0  # as OpCall's


class CollectiveEntry(NamedTuple):
    """One collective this rank issued in a process group, in order."""

    seq: int  # its number in the group, from 1
    op: str  # as issued (see neuronsim.collectives for its canonical name)
    shapes: list  # of its tensor arguments
    dtype: str
    reduce_op: str | None
    peer: int | None  # send and recv: the other rank (global)
    site: str  # the source line that issued it
    # (element count, dtype) of each tensor of its agreed argument (neuronsim.collectives)
    agreed: tuple = ()


@dataclasses.dataclass
class GroupLog:
    """A process group as this rank knows it, and the collectives it issued in it."""

    name: str
    desc: str
    ranks: list  # global ranks of the members, in group-rank order
    entries: list = dataclasses.field(default_factory=list)  # CollectiveEntry
    truncated: bool = False  # the log stopped at its bound


@dataclasses.dataclass(eq=False)  # buckets are told apart by identity while they record
class Bucket:
    """Counts of calls in one span of the run: an optimizer step, a region, a generation phase."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # OpCall -> calls
    collectives: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # CollectiveCall
    graphs: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # graph name -> runs
    name: str | None = None  # a region's name
    phase: str | None = None  # a generation forward's: "prefill" or "decode"
    tokens: int | None = None  # tokens per sequence of that forward

    def typed(self) -> "Bucket":
        """The same bucket with its keys as the record types (the recorder counts plain tuples)."""
        return dataclasses.replace(
            self,
            ops=collections.Counter({OpCall(*k): n for k, n in self.ops.items()}),
            collectives=collections.Counter({CollectiveCall._make(k): n for k, n in self.collectives.items()}),
            graphs=collections.Counter(self.graphs),
        )


class MemoryCategory(str, enum.Enum):
    """What holds a storage at the memory peak."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    COLLECTIVE_BUFFERS = "collective buffers"
    ACTIVATIONS = "activations and temporaries"


@dataclasses.dataclass
class TopTensor:
    """A live storage at the snapshot: its size, the first tensor seen on it, the op that made it."""

    bytes: int
    shape: list
    dtype: str
    op: str
    kind: str | None = None  # a MemoryCategory's value, where the run knows it


@dataclasses.dataclass
class MemorySnapshot:
    """The live storages of a core at its highest usage seen (within the ledger's step)."""

    at: int = 0
    top: list = dataclasses.field(default_factory=list)  # TopTensor, largest first
    breakdown: dict | None = None  # MemoryCategory value -> bytes, where the run knows it


@dataclasses.dataclass
class CoreMemory:
    """One logical core's memory over the run."""

    peak_allocated: int
    peak_reserved: int
    capacity: int
    num_ooms: int
    series: list  # (seconds since start, allocated, reserved)
    snapshot: MemorySnapshot


@dataclasses.dataclass
class Fallback:
    """Calls of an op that (would) run on the host CPU, by where they were issued."""

    op: str
    dtype: str
    reason: str
    count: int
    sites: dict  # "path:line (function)" -> calls


@dataclasses.dataclass
class CompileRecord:
    """What torch.compile did during the run (Dynamo's counters are process-wide: deltas)."""

    graphs: list = dataclasses.field(default_factory=list)
    recompilations: list = dataclasses.field(default_factory=list)
    fallbacks: list = dataclasses.field(default_factory=list)
    graph_break_counts: dict = dataclasses.field(default_factory=dict)  # reason -> count
    graph_breaks: list = dataclasses.field(default_factory=list)  # {"reason", "site", "count"}
    step_recompilations: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ValueRead:
    """A dry run's read of a tensor value it did not have: answered with ``value``."""

    site: str
    kind: str  # "int", "float", "bool", "bool (library branch)"; for an assumed check, the check
    value: object
    count: int
    assumed: bool = False  # a finiteness check answered as if the data were finite


@dataclasses.dataclass
class Generation:
    """Top-level forwards while no optimizer step ran: the phases of a generation."""

    forwards: list = dataclasses.field(default_factory=list)  # Bucket with phase and tokens
    compiled_outside: bool = False  # a compiled graph ran outside an eager forward


@dataclasses.dataclass
class PipelineRecord:
    """The pipeline schedule this rank ran (torch.distributed.pipelining): what the time model
    composes a step of. Its stages' actions of the last step (a micro-batch's forward "F",
    backward "B", or the inputs' "I" and weights' "W" halves of it) are counted in buckets of their
    own, by stage, kind and micro-batch; `ran` counts them by stage and kind (a dry run may run
    fewer micro-batches than `microbatches`: the first and last as the script's, the others each
    the same work)."""

    schedule: str  # the schedule's class, e.g. "Schedule1F1B"
    microbatches: int  # per step, as the script asked
    stages: int  # in the whole pipeline
    stage_indices: list  # this rank's
    group: list  # the pipeline group's global ranks, in group-rank order
    order: dict  # group rank -> [(stage, kind, micro-batch)] of one step, in order
    actions: dict = dataclasses.field(default_factory=dict)  # "stage:kind:micro-batch" -> Bucket
    ran: dict = dataclasses.field(default_factory=dict)  # "stage:kind" -> actions run in the last step
    steps: int = 0  # schedule steps run


@dataclasses.dataclass
class Recording:
    """One process's (one rank's) run."""

    rank: int = 0
    world_size: int = 1
    instance_type: str = "trn2.3xlarge"
    lnc: int = 2
    steps: int = 0  # optimizer steps seen
    fp32_precision: str = "highest"
    wall_seconds: float = 0.0
    buckets: list = dataclasses.field(default_factory=lambda: [Bucket()])  # one per step, then the rest
    graph_parts: dict = dataclasses.field(default_factory=dict)  # graph name -> [GraphPart]
    regions: list = dataclasses.field(default_factory=list)  # Bucket with its name, in order of entry
    generation: Generation = dataclasses.field(default_factory=Generation)
    fallbacks: list = dataclasses.field(default_factory=list)  # Fallback
    groups: dict = dataclasses.field(default_factory=dict)  # process group name -> GroupLog
    memory: dict = dataclasses.field(default_factory=dict)  # core -> CoreMemory
    compile: CompileRecord = dataclasses.field(default_factory=CompileRecord)
    recorder_errors: dict = dataclasses.field(default_factory=dict)  # what could not be recorded -> times
    error: str | None = None  # how the run ended, when it raised
    dry_run: bool = False
    value_reads: list = dataclasses.field(default_factory=list)  # ValueRead (dry run)
    # files a dry run saved without data: {"path", "tensors", "bytes", "site"}, and "written": False
    # for torch.save's, not written at all (a path, or what the file object was)
    saved_without_data: list = dataclasses.field(default_factory=list)
    # weights a dry run loaded header-only stand-ins for (or could not): {"path", "absent", "class", ...}
    absent_weights: list = dataclasses.field(default_factory=list)
    pipeline: PipelineRecord | None = None  # a pipeline-parallel run's schedule and actions
    extra: dict = dataclasses.field(default_factory=dict)  # a caller's own keys (benchmarks)

    def region(self, name: str) -> Bucket:
        """The region of that name (the first, when it was entered more than once)."""
        for b in self.regions:
            if b.name == name:
                return b
        raise KeyError(f"no region {name!r} in this recording; it has {[b.name for b in self.regions]}")

    def for_estimate(self) -> "Recording":
        """A copy with only what the time model reads (a pinned recording stays small)."""
        return dataclasses.replace(
            self, memory={}, fallbacks=[], groups={}, compile=CompileRecord(), value_reads=[], recorder_errors={}
        )

    def to_json(self, **dump) -> str:
        """The recording as JSON (the current version), e.g. to pin it in a test."""
        return json.dumps(_to_dict(self), **dump)

    @classmethod
    def from_json(cls, data) -> "Recording":
        """A recording from :meth:`to_json`'s text (or its parsed dict), of any version."""
        d = json.loads(data) if isinstance(data, (str, bytes)) else data
        version = d.get("version", 1)
        if version == 1:
            return _from_v1(d)
        if version not in (2, 3, 4, VERSION):
            raise ValueError(
                f"recording version {version} is newer than this torch-neuronx reads ({VERSION}); "
                "upgrade torch-neuronx to read it"
            )
        return _from_dict(d)


# -- serialisation ----------------------------------------------------------------------
def _call_to_dict(call) -> dict:
    """An OpCall's or GraphPart's fields (the tile count only where a version 3-4 recording had one)."""
    d = call._asdict()
    if not d["tile_flops"]:
        del d["tile_flops"]
    return d


def _call_from_dict(typ, r: dict):
    """An OpCall or GraphPart from its dict (matmuls as tuples: calls are counted by value)."""
    fields = {f: r[f] for f in typ._fields if f in r}
    fields["matmuls"] = tuple(tuple(m) for m in fields.get("matmuls", ()))
    return typ(**fields)


def _entry_from_json(e) -> CollectiveEntry:
    """A CollectiveEntry written by name, or positionally (versions 1-4, whose agreed sizes come
    from their shapes: every tensor argument of a collective that agrees on sizes)."""
    if isinstance(e, dict):
        return CollectiveEntry(**{**e, "agreed": tuple(tuple(a) for a in e.get("agreed", ()))})
    entry = CollectiveEntry(*e)
    found = _collectives.find(entry.op)
    if found is None or not found.agrees_on_sizes:
        return entry
    return entry._replace(agreed=tuple((math.prod(s), entry.dtype) for s in entry.shapes))


def _bucket_to_dict(b: Bucket) -> dict:
    d = {
        "ops": [{**_call_to_dict(OpCall._make(k)), "calls": n} for k, n in b.ops.items()],
        "collectives": [{**CollectiveCall._make(k)._asdict(), "calls": n} for k, n in b.collectives.items()],
        "graphs": [{"graph": g, "runs": n} for g, n in b.graphs.items()],
    }
    for key in ("name", "phase", "tokens"):
        if getattr(b, key) is not None:
            d[key] = getattr(b, key)
    return d


def _bucket_from_dict(d: dict) -> Bucket:
    def counted(rows, make, count):
        return collections.Counter({make(r): r[count] for r in rows})

    return Bucket(
        ops=counted(d.get("ops", []), lambda r: _call_from_dict(OpCall, r), "calls"),
        collectives=counted(
            d.get("collectives", []),
            lambda r: CollectiveCall(**{f: r[f] for f in CollectiveCall._fields if f in r}),
            "calls",
        ),
        graphs=collections.Counter({r["graph"]: r["runs"] for r in d.get("graphs", [])}),
        name=d.get("name"),
        phase=d.get("phase"),
        tokens=d.get("tokens"),
    )


def _to_dict(r: Recording) -> dict:
    d = {"version": VERSION}
    for f in dataclasses.fields(r):
        d[f.name] = getattr(r, f.name)
    d["buckets"] = [_bucket_to_dict(b) for b in r.buckets]
    d["regions"] = [_bucket_to_dict(b) for b in r.regions]
    d["graph_parts"] = {g: [_call_to_dict(p) for p in map(GraphPart._make, ps)] for g, ps in r.graph_parts.items()}
    d["generation"] = {
        "compiled_outside": r.generation.compiled_outside,
        "forwards": [_bucket_to_dict(b) for b in r.generation.forwards],
    }
    d["fallbacks"] = [dataclasses.asdict(f) for f in r.fallbacks]
    d["groups"] = {
        name: {**dataclasses.asdict(g), "entries": [e._asdict() for e in g.entries]} for name, g in r.groups.items()
    }
    d["memory"] = {str(c): _memory_to_dict(m) for c, m in r.memory.items()}
    d["compile"] = dataclasses.asdict(r.compile)
    d["value_reads"] = [dataclasses.asdict(v) for v in r.value_reads]
    d["pipeline"] = _pipeline_to_dict(r.pipeline)
    return d


def _pipeline_to_dict(p: PipelineRecord | None) -> dict | None:
    if p is None:
        return None
    d = dataclasses.asdict(p)
    d["order"] = {str(k): [list(a) for a in v] for k, v in p.order.items()}
    d["actions"] = {k: _bucket_to_dict(b) for k, b in p.actions.items()}
    return d


def _pipeline_from_dict(d: dict | None) -> PipelineRecord | None:
    if d is None:
        return None
    return PipelineRecord(
        **{k: d[k] for k in ("schedule", "microbatches", "stages", "stage_indices", "group", "ran", "steps")},
        order={int(k): [tuple(a) for a in v] for k, v in d["order"].items()},
        actions={k: _bucket_from_dict(b) for k, b in d["actions"].items()},
    )


def _memory_to_dict(m: CoreMemory) -> dict:
    d = dataclasses.asdict(m)
    if m.snapshot.breakdown is not None:
        d["snapshot"]["breakdown"] = {MemoryCategory(k).value: v for k, v in m.snapshot.breakdown.items()}
    return d


def _memory_from_dict(d: dict) -> CoreMemory:
    s = d["snapshot"]
    snap = MemorySnapshot(s["at"], [TopTensor(**t) for t in s["top"]], s.get("breakdown"))
    return CoreMemory(
        d["peak_allocated"], d["peak_reserved"], d["capacity"], d["num_ooms"], [tuple(p) for p in d["series"]], snap
    )


def _from_dict(d: dict) -> Recording:
    gen = d.get("generation") or {}
    return Recording(
        **{k: d[k] for k in _SCALARS if k in d},
        buckets=[_bucket_from_dict(b) for b in d.get("buckets", [{}])],
        regions=[_bucket_from_dict(b) for b in d.get("regions", [])],
        graph_parts={g: [_call_from_dict(GraphPart, p) for p in ps] for g, ps in d.get("graph_parts", {}).items()},
        generation=Generation(
            [_bucket_from_dict(b) for b in gen.get("forwards", [])], gen.get("compiled_outside", False)
        ),
        fallbacks=[Fallback(**f) for f in d.get("fallbacks", [])],
        groups={
            n: GroupLog(g["name"], g["desc"], g["ranks"], [_entry_from_json(e) for e in g["entries"]], g["truncated"])
            for n, g in d.get("groups", {}).items()
        },
        memory={int(c): _memory_from_dict(m) for c, m in d.get("memory", {}).items()},
        compile=CompileRecord(**d.get("compile", {})),
        recorder_errors=dict(d.get("recorder_errors", {})),
        value_reads=[ValueRead(**v) for v in d.get("value_reads", [])],
        saved_without_data=[dict(f) for f in d.get("saved_without_data", [])],
        absent_weights=[dict(a) for a in d.get("absent_weights", [])],
        pipeline=_pipeline_from_dict(d.get("pipeline")),
        extra=dict(d.get("extra", {})),
    )


_SCALARS = ("rank", "world_size", "instance_type", "lnc", "steps", "fp32_precision", "wall_seconds", "error", "dry_run")


def _from_v1(d: dict) -> Recording:
    """The positional layout of recordings written before version 2 (saved pins load as they are)."""

    def bucket(ops=(), colls=(), graphs=(), **named) -> Bucket:
        return Bucket(
            ops=collections.Counter({OpCall(*row[:6]): row[6] for row in ops}),
            collectives=collections.Counter({CollectiveCall(*row[:4]): row[4] for row in colls}),
            graphs=collections.Counter({row[0]: row[1] for row in graphs}),
            **named,
        )

    graphs = d.get("graphs") or [[]] * len(d.get("ops", [[]]))
    fw = d.get("forwards") or {}
    known = set(_SCALARS) | {"ops", "collectives", "graphs", "graph_parts", "forwards", "fallbacks", "memory"}
    known |= {"compile", "collector_errors", "dry_run"}
    return Recording(
        **{k: d[k] for k in _SCALARS if k in d and k != "dry_run"},
        buckets=[bucket(o, c, g) for o, c, g in zip(d.get("ops", [[]]), d.get("collectives", [[]]), graphs)],
        graph_parts={g: [GraphPart(*p) for p in ps] for g, ps in d.get("graph_parts", {}).items()},
        generation=Generation(
            [
                bucket(b["ops"], b["collectives"], b["graphs"], phase=b["phase"], tokens=b["tokens"])
                for b in fw.get("buckets", [])
            ],
            fw.get("compiled_outside", False),
        ),
        fallbacks=[Fallback(**f) for f in d.get("fallbacks", [])],
        memory={int(c): _v1_memory(m) for c, m in d.get("memory", {}).items()},
        compile=CompileRecord(**d["compile"]) if "compile" in d else CompileRecord(),
        recorder_errors=dict(d.get("collector_errors") or {}),
        dry_run=d.get("dry_run") is not None,
        value_reads=_v1_reads(d.get("dry_run")),
        extra={k: v for k, v in d.items() if k not in known},
    )


def _v1_memory(m: dict) -> CoreMemory:
    snap = MemorySnapshot(m["top_tensors_at"], [TopTensor(**t) for t in m["top_tensors"]], m.get("breakdown"))
    return CoreMemory(
        m["peak_allocated"], m["peak_reserved"], m["capacity"], m["num_ooms"], [tuple(p) for p in m["series"]], snap
    )


def _v1_reads(dry: dict | None) -> list:
    if not dry:
        return []
    reads = [ValueRead(v["site"], v["kind"], v["placeholder"], v["count"]) for v in dry["value_reads"]]
    return reads + [ValueRead(a["site"], a["check"], a["value"], a["count"], True) for a in dry["assumed"]]
