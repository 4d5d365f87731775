"""Trainium hardware figures: the one table that the simulator (instance shapes and
HBM per core), the NKI rules and cost model, and the readiness estimates read.

Pure Python (standard library only): the NKI simulator reads it without torch.

Sources: AWS Neuron documentation (aws-neuron-sdk, 2026): the Trainium / Trainium2 /
Trainium3 architecture pages, the NeuronCore-v2 page, "Trainium/Inferentia2 Architecture
Guide for NKI" and "Trainium2 Architecture Guide for NKI" (engine clocks, per-core Tensor
Engine rates, SBUF/PSUM, DMA engines), "Introduction to DMA with NKI" (DMA engines per
core), "Guideline to Avoid Under-Utilizing DMA Bandwidth" (sustained DMA bandwidth per
engine by generation, fixed cost of a DMA transfer), the Trn1 / Trn2 / Trn3 instance pages
(NeuronLink, EFA). Where AWS's own figures disagree (8 x 79 = 632 vs the 667 TFLOPS chip
figure; HBM 2.9 vs 3 TB/s on trn2; 27.2 GB/s theoretical vs 17 / 23 B/ns sustained per DMA
engine on trn1 / trn2), the per-core figure, the chip HBM figure of the architecture page
and the sustained DMA figure are used. Figures AWS does not publish are None: code that needs one
must say it is missing rather than guess.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from . import settings as _settings

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One Trainium chip. Per-core figures are per *physical* NeuronCore."""

    name: str  # "trn1", "trn2", "trn3"
    nc_version: str  # NeuronCore generation: "v2", "v3", "v4"
    physical_cores: int  # NeuronCores per chip
    lnc_allowed: tuple  # logical NeuronCore configs (physical cores per logical core)
    lnc_default: int
    hbm_bytes: int  # per chip
    hbm_bytes_per_s: float  # per chip
    # Tensor Engine dense peak per physical core, FLOP/s by input dtype name.
    tensor_flops: MappingProxyType
    vector_flops: float | None  # Vector Engine FP32 FLOP/s per core
    scalar_flops: float | None  # Scalar Engine FP32 FLOP/s per core
    # Engine clocks (Hz); None where AWS publishes none.
    tensor_hz: float | None
    vector_hz: float | None
    scalar_hz: float | None
    gpsimd_hz: float | None
    # Vector Engine data-path width (elements/cycle over all 128 lanes) for 32-bit data,
    # and with BF16/FP16 input and output ("Compute Engine Specifications" tables of the
    # Trainium2/Trainium3 Architecture Guides for NKI); None where unpublished.
    vector_width_fp32: int | None
    vector_width_16bit: int | None
    sbuf_bytes: int  # per core: partitions x bytes per partition
    psum_bytes: int  # per core
    psum_banks: int
    partitions: int
    gemm_stationary_fmax: int  # matmul stationary (LHS) free size
    gemm_moving_fmax: int  # matmul moving (RHS) free size
    psum_out_dtypes: tuple  # dtype names a matmul may write to PSUM
    dma_engines: int  # per core
    dma_bytes_per_s_per_engine: float | None
    dma_fixed_s: float | None  # fixed cost of one DMA transfer
    # Per chip, inside an instance / UltraServer, both directions summed: AWS states chip-to-chip
    # link figures as the sum over a chip's links of both directions (the Trn3 architecture page
    # says so outright: "four PCIe Gen6 x8 links ... a total of 256 GB/s of bidirectional
    # bandwidth"; PCIe Gen6 x8 is 32 GB/s each way).
    neuronlink_bytes_per_s: float | None

    def per_core(self, lnc: int = 1) -> dict:
        """Figures of one logical NeuronCore made of `lnc` physical cores."""
        share = lnc / self.physical_cores
        return {
            "hbm_bytes": int(self.hbm_bytes * share),
            "hbm_bytes_per_s": self.hbm_bytes_per_s * share,
            "tensor_flops": {k: v * lnc for k, v in self.tensor_flops.items()},
            "vector_flops": None if self.vector_flops is None else self.vector_flops * lnc,
            "dma_bytes_per_s": (
                None
                if self.dma_bytes_per_s_per_engine is None
                else self.dma_bytes_per_s_per_engine * self.dma_engines * lnc
            ),
        }


def _flops(**by_dtype):
    return MappingProxyType({k: v * 1e12 for k, v in by_dtype.items()})


CHIPS = MappingProxyType(
    {
        # Trainium1 (Trainium architecture page): 2 NeuronCore-v2, 190 TFLOPS BF16/FP16/TF32
        # and 47.5 FP32 per chip, 32 GiB HBM at 820 GB/s; the per-core rates are half of
        # those (the NKI guide's 92 / 23 TFLOPS per core is ~3% lower: the chip figure is
        # used, as for trn2). NeuronCore-v2 page: Vector Engine 2.3 TFLOPS FP32, Scalar
        # Engine 2.9 TFLOPS FP32. NKI guide: Tensor 2.8 GHz, Vector 1.12 GHz, Scalar and
        # GpSimd 1.4 GHz. DMA: 16 engines per core ("Introduction to DMA with NKI"); "Guideline
        # to Avoid Under-Utilizing DMA Bandwidth" (NKI deep dives, 2026-04) tabulates the
        # sustained peak per engine by generation, TRN1 17 B/ns (272 GB/s per core), TRN2 23,
        # TRN3 33 (the figures used for trn2/trn3 too; the DMA introduction's 27.2 GB/s per
        # engine is its theoretical rate), and gives the fixed cost of a transfer (descriptor
        # setup, synchronisation, semaphore-to-start) as ~1300 ns cross-engine for all three
        # generations alike, with no per-generation figure: so trn1 uses 1.3 us as trn2/trn3
        # do. Trn1 instance page: NeuronLink-v2 384 GiB/s per chip on trn1.32xlarge (768 on
        # trn1n.32xlarge: an Instance override).
        "trn1": Chip(
            name="trn1",
            nc_version="v2",
            physical_cores=2,
            lnc_allowed=(1,),
            lnc_default=1,
            hbm_bytes=32 * GiB,
            hbm_bytes_per_s=820e9,
            tensor_flops=_flops(bfloat16=95.0, float16=95.0, tf32=95.0, float32=23.75),
            vector_flops=2.3e12,
            scalar_flops=2.9e12,
            tensor_hz=2.8e9,
            vector_hz=1.12e9,
            scalar_hz=1.4e9,
            gpsimd_hz=1.4e9,
            vector_width_fp32=None,
            vector_width_16bit=None,
            sbuf_bytes=24 * MiB,
            psum_bytes=2 * MiB,
            psum_banks=8,
            partitions=128,
            gemm_stationary_fmax=128,
            gemm_moving_fmax=512,
            psum_out_dtypes=("float32",),
            dma_engines=16,
            dma_bytes_per_s_per_engine=17e9,
            dma_fixed_s=1.3e-6,
            neuronlink_bytes_per_s=384 * GiB,
        ),  # fmt: skip
        # Trainium2: 8 NeuronCore-v3; per core 79 TFLOPS BF16/FP16/TF32, 158 FP8, 20 FP32;
        # Tensor 2.4 GHz, Vector 0.96 GHz, Scalar 1.2 GHz, GpSimd 1.2 GHz; 16 DMA engines of
        # 23 B/ns; 96 GiB HBM at 2.9 TB/s per chip; NeuronLink-v3 1,024 GB/s per chip.
        "trn2": Chip(
            name="trn2",
            nc_version="v3",
            physical_cores=8,
            lnc_allowed=(1, 2),
            lnc_default=2,
            hbm_bytes=96 * GiB,
            hbm_bytes_per_s=2.9e12,
            tensor_flops=_flops(bfloat16=79.0, float16=79.0, tf32=79.0, float8=158.0, float32=20.0),
            vector_flops=1.0e12,
            scalar_flops=1.2e12,
            tensor_hz=2.4e9,
            vector_hz=0.96e9,
            scalar_hz=1.2e9,
            gpsimd_hz=1.2e9,
            vector_width_fp32=256,
            vector_width_16bit=512,
            sbuf_bytes=28 * MiB,
            psum_bytes=2 * MiB,
            psum_banks=8,
            partitions=128,
            gemm_stationary_fmax=128,
            gemm_moving_fmax=512,
            psum_out_dtypes=("float32",),
            dma_engines=16,
            dma_bytes_per_s_per_engine=23e9,
            dma_fixed_s=1.3e-6,
            neuronlink_bytes_per_s=1024e9,
        ),  # fmt: skip
        # Trainium3: 8 NeuronCore-v4; per core 79 TFLOPS BF16, 315 MXFP8/MXFP4, 20 FP32;
        # Tensor 2.4 GHz, Vector/Scalar/GpSimd 1.2 GHz; 16 DMA engines of 33 B/ns; 144 GiB
        # HBM at 4.9 TB/s per chip; SBUF 32 MiB; NeuronLink-v4 2.56 TB/s per chip.
        "trn3": Chip(
            name="trn3",
            nc_version="v4",
            physical_cores=8,
            lnc_allowed=(1, 2),
            lnc_default=2,
            hbm_bytes=144 * GiB,
            hbm_bytes_per_s=4.9e12,
            tensor_flops=_flops(bfloat16=79.0, float16=79.0, tf32=79.0, float8=315.0, float32=20.0),
            vector_flops=1.2e12,
            scalar_flops=1.2e12,
            tensor_hz=2.4e9,
            vector_hz=1.2e9,
            scalar_hz=1.2e9,
            gpsimd_hz=1.2e9,
            vector_width_fp32=256,
            vector_width_16bit=512,
            sbuf_bytes=32 * MiB,
            psum_bytes=2 * MiB,
            psum_banks=8,
            partitions=128,
            gemm_stationary_fmax=128,
            gemm_moving_fmax=512,
            psum_out_dtypes=("float32", "bfloat16"),
            dma_engines=16,
            dma_bytes_per_s_per_engine=33e9,
            dma_fixed_s=1.3e-6,
            neuronlink_bytes_per_s=2560e9,
        ),  # fmt: skip
    }
)


@dataclasses.dataclass(frozen=True)
class Instance:
    """An EC2 instance type: how many chips of which kind, and its network."""

    name: str
    chip: str  # key of CHIPS
    chips: int
    efa_bytes_per_s: float | None  # per instance, between instances
    # NeuronLink per chip where the instance differs from its chip's figure (trn1n doubles trn1's).
    neuronlink_bytes_per_s: float | None = None

    @property
    def spec(self) -> Chip:
        return CHIPS[self.chip]


INSTANCES = MappingProxyType(
    {
        i.name: i
        for i in (
            Instance("trn1.2xlarge", "trn1", 1, None),
            Instance("trn1.32xlarge", "trn1", 16, 800e9 / 8),
            Instance("trn1n.32xlarge", "trn1", 16, 1600e9 / 8, neuronlink_bytes_per_s=768 * GiB),
            Instance("trn2.3xlarge", "trn2", 1, None),
            Instance("trn2.48xlarge", "trn2", 16, 3200e9 / 8),
            Instance("trn2u.48xlarge", "trn2", 16, 3200e9 / 8),
            # trn3 instances are not published apart from UltraServers; these two are ours,
            # shaped like their trn2 namesakes.
            Instance("trn3.3xlarge", "trn3", 1, None),
            Instance("trn3.48xlarge", "trn3", 16, 12800e9 / 8 / 4),
        )
    }
)

DEFAULT_INSTANCE = "trn2.3xlarge"


def instance(name: str | None = None) -> Instance:
    """The instance `name`, or the one TORCH_NEURONX_INSTANCE_TYPE selects."""
    name = name or _settings.get("TORCH_NEURONX_INSTANCE_TYPE") or DEFAULT_INSTANCE
    try:
        return INSTANCES[name]
    except KeyError:
        raise ValueError(
            f"TORCH_NEURONX_INSTANCE_TYPE='{name}' is not a supported instance type; "
            f"choose one of {', '.join(INSTANCES)}"
        ) from None


def chip(name: str | None = None) -> Chip:
    """A chip by name ("trn2"), or the chip of the selected instance type."""
    if name in CHIPS:
        return CHIPS[name]
    if name is None:
        return instance().spec
    raise ValueError(f"unknown Trainium chip '{name}'; choose one of {', '.join(CHIPS)}")


class MissingFigure(ValueError):
    """AWS publishes no figure a model needs for a chip: there is no estimate for it."""


# Published figures and behaviour the readiness time model reads (its own choices among them,
# e.g. the ring step latency, live in torch_neuronx/readiness with their reasoning).
#
# Tensor Engine throttling (Trainium2 Architecture Guide for NKI): after an idle gap the
# engine starts at about 50% and ramps to full speed over about 3 us.
TENSOR_ENGINE_RAMP_S = 3e-6
TENSOR_ENGINE_RAMP_START = 0.5

# Collectives inside one Trainium2/3 instance ("Intra-node Collective Communications with AWS
# Neuron", Neuron runtime documentation, 2025-12): the runtime picks by message size Mesh below
# 1 MB (O(1): a reduce-scatter and an all-gather of two steps each, data routed straight to every
# chip), Recursive Doubling-Halving from 1 to 56 MB (one intra-chip step and log2(chips)
# inter-chip steps each way) and KangaRing above 56 MB (a ring of one primary rank per pair: half
# the ring's hops). "The per-hop latency of Ring/KangaRing is about 1-2 us (HBM load dependent)".
INTRANODE_CHIPS = ("trn2", "trn3")  # the chips that page describes (4 logical ranks per chip)
INTRANODE_HOP_LATENCY_RANGE_S = (1e-6, 2e-6)
INTRANODE_MESH_MAX_BYTES = 1 << 20
INTRANODE_RDH_MAX_BYTES = 56 << 20
