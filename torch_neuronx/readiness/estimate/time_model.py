"""Estimated time of a recorded run on real Trainium.

Each op is timed from its FLOPs and bytes (from its shapes and dtypes) by a roofline on one
logical NeuronCore's published figures (neuronsim/hardware.py, the table the NKI cost model
reads), plus the fixed costs a roofline leaves out; each collective by the latency/bandwidth
model of ``collective_time``; a bucket of them by the overlap rule; a step, a phase and a rank by
``steps``. Everything chip-dependent (figures, tiles) is applied here, at estimate time: the
recording holds shapes only. The assumptions every report prints are in ``assumptions``.
"""

from __future__ import annotations

import functools

from neuronsim import hardware as hw
from neuronsim import measured as _measured
from neuronsim import neuroncore as _core
from neuronsim import tensor_engine as _te

from . import collective_time as _collective_time

_RAMP_AVG = (1 + hw.TENSOR_ENGINE_RAMP_START) / 2


def _tensor_engine_efficiency() -> float:
    """What the Tensor Engine achieves of what this model's tile rule gives at peak: AWS's
    measured best matmul (neuronsim.measured), timed by the rule, over its measured time. The
    only published measurement (trn1); applied to every chip (AWS publishes none for the others)."""
    m = _measured.TENSOR_ENGINE_MATMUL
    chip = hw.CHIPS[m["chip"]]
    flops = 2 * m["m"] * m["k"] * m["n"]
    modelled = (
        flops * _te.occupancy(chip, ((m["m"], m["k"], m["n"], 1),)) / chip.per_core(1)["tensor_flops"][m["dtype"]]
    )
    return modelled / m["seconds"]


TENSOR_ENGINE_EFFICIENCY = _tensor_engine_efficiency()


_FIGURE_NAMES = {
    "vector_flops": "Vector Engine FLOP/s",
    "dma_bytes_per_s": "DMA bandwidth",
    "dma_fixed_s": "DMA fixed-cost",
    "neuronlink_bytes_per_s": "NeuronLink bandwidth",
}


def core_figures(chip: str, lnc: int, instance: str | None = None) -> dict:
    """The per-logical-core figures the model uses (and prints); `instance` may override NeuronLink."""
    spec = hw.CHIPS[chip]
    if lnc not in spec.lnc_allowed:
        raise ValueError(f"{chip} supports LNC={spec.lnc_allowed}, not LNC={lnc}")
    core = spec.per_core(lnc)
    inst = hw.INSTANCES[instance] if instance else None
    link = (inst.neuronlink_bytes_per_s if inst else None) or spec.neuronlink_bytes_per_s
    ranks = (inst.chips if inst else 1) * (spec.physical_cores // lnc)
    efa = inst.efa_bytes_per_s / ranks if inst and inst.efa_bytes_per_s else None
    have = {**core, "dma_fixed_s": spec.dma_fixed_s, "neuronlink_bytes_per_s": link}
    missing = [name for key, name in _FIGURE_NAMES.items() if have[key] is None]
    if missing:
        raise hw.MissingFigure(f"no estimate for {chip}: AWS publishes no {' or '.join(missing)} figure for it")
    return {
        "chip": chip,
        "lnc": lnc,
        "tensor_flops": dict(core["tensor_flops"]),
        "vector_flops": core["vector_flops"],
        "memory_bytes_per_s": min(core["hbm_bytes_per_s"], core["dma_bytes_per_s"]),
        "dma_fixed_s": spec.dma_fixed_s,
        "link_bytes_per_s": link * _collective_time.NEURONLINK_SEND_SHARE / (spec.physical_cores // lnc),
        **_intranode_figures(spec, lnc, instance),
        "efa_bytes_per_s": efa,  # per rank, when every rank of the instance talks off the instance at once
    }


def _intranode_figures(spec, lnc: int, instance: str | None) -> dict:
    """Ranks per chip and in the instance, where AWS publishes how collectives run inside one."""
    if spec.name not in hw.INTRANODE_CHIPS or not instance:
        return {"intranode_ranks": None}
    per_chip = spec.physical_cores // lnc
    return {"intranode_ranks": hw.INSTANCES[instance].chips * per_chip, "ranks_per_chip": per_chip}


def tensor_rate(fig: dict, dtype: str, fp32_precision: str) -> float:
    rates = fig["tensor_flops"]
    if dtype in ("bfloat16", "float16"):
        return rates[dtype]
    if dtype.startswith("float8"):
        return rates["float8"]
    if dtype == "float32" and fp32_precision != "highest":
        return rates["tf32"]
    return rates["float32"]


@functools.lru_cache(maxsize=1 << 14)
def _occupancy(chip: str, matmuls: tuple) -> float:
    return _te.occupancy(hw.CHIPS[chip], matmuls)


def tile_flops(fig: dict, call) -> int | None:
    """The FLOPs the Tensor Engine's tiles occupy the array for while a recorded matmul-like call
    runs on `fig`'s chip (its FLOPs when every dimension fills its tiles), from the matmuls'
    shapes the recording holds (a version 3-4 recording: the tiles it recorded); None where its
    shapes say nothing (timed at its FLOPs)."""
    if call.matmuls:
        return round(call.flops * _occupancy(fig["chip"], call.matmuls))
    return call.tile_flops or None


def call_time(fig: dict, call, fp32_precision: str = "highest") -> tuple:
    """(seconds, {"fixed", "compute", "memory"}) of one :class:`OpCall` or :class:`GraphPart`."""
    tiles = tile_flops(fig, call) if call.kind == "tensor" else None
    return op_time(fig, call.kind, call.dtype, call.flops, call.bytes, call.operands, fp32_precision, tiles)


def op_time(
    fig: dict,
    kind: str,
    dtype: str,
    flops: int,
    nbytes: int,
    operands: int,
    fp32_precision: str = "highest",
    tile_flops: int | None = None,
) -> tuple:
    """(seconds, {"fixed", "compute", "memory"}) of one call; a Tensor Engine op's compute time is
    that of the FLOPs its tiles occupy the array for (`tile_flops`, when known)."""
    if kind == "view":
        return 0.0, {"fixed": 0.0, "compute": 0.0, "memory": 0.0}
    # each operand one transfer over the partitions, its efficiency by its size (the mean operand's)
    memory = nbytes / (fig["memory_bytes_per_s"] * _core.dma_efficiency(nbytes / max(operands, 1)))
    fixed = _core.dma_fixed_seconds(fig["dma_fixed_s"], operands)  # one launch's transfers, in turn
    if kind == "tensor":
        rate = tensor_rate(fig, dtype, fp32_precision) * TENSOR_ENGINE_EFFICIENCY
        compute = (tile_flops or flops) / rate
        # The engine ramps from 50% speed: the first RAMP_S do RAMP_S * avg of the work.
        ramp_work = hw.TENSOR_ENGINE_RAMP_S * _RAMP_AVG
        fixed += min(compute, ramp_work) * (1 / _RAMP_AVG - 1)
    elif kind == "fused":  # a compiled graph's fused kernel: flops counts its vector operations
        compute = _core.vector_element_seconds(flops, fig["vector_flops"])
    else:
        itemsize = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
        compute = _core.vector_element_seconds(nbytes / itemsize, fig["vector_flops"])
    return fixed + max(compute, memory), {"fixed": fixed, "compute": compute, "memory": memory}


def pipeline_seconds(stage_seconds: list, microbatches: int) -> float:
    """Forward and backward time of `microbatches` micro-batches through pipeline stages that
    take `stage_seconds` each per micro-batch, under a 1F1B schedule (see ASSUMPTIONS)."""
    if microbatches < 1 or not stage_seconds:
        raise ValueError(
            f"a pipeline needs at least one stage and one micro-batch, got {len(stage_seconds)} "
            f"stage(s) and {microbatches} micro-batch(es)"
        )
    return sum(stage_seconds) + (microbatches - 1) * max(stage_seconds)
