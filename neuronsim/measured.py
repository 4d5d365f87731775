"""Published measurements of Trainium primitives: the one table the time model's constants come from.

Every entry is a figure AWS measured on hardware and published in the Neuron documentation (the
aws-neuron-sdk repository, file and SDK release named), with what was measured. Specifications
(peak rates, link bandwidths) are in ``hardware``; the rules that choose among these measurements
and apply them are in ``torch_neuronx/readiness/estimate``. End-to-end figures (a model's
throughput) never set a value here: they only validate the estimates made from it.

Pure Python (standard library only).
"""

from __future__ import annotations

import dataclasses

NCCOM_TEST = "NCCOM-TEST User Guide (tools/neuron-sys-tools/nccom-test.rst)"


@dataclasses.dataclass(frozen=True)
class CollectiveSweep:
    """One nccom-test example: a collective's time by message size on one chip generation.

    `points` are (bytes, microseconds) as printed: `bytes` is nccom-test's size (an all-gather's
    gathered output, an all-reduce's buffer), the time one collective of that size took inside a
    NEFF that runs many back to back (no launch cost). `alone` is False for an example that ran
    another stream of collectives at the same time. `chip` is AWS's where the page names the
    instance, else inferred (`inferred` says from what).
    """

    op: str  # "all_reduce" or "all_gather" (nccom-test's allr / allg)
    chip: str
    ranks: int
    instances: int
    sdk: str
    points: tuple
    source: str
    inferred: str = ""
    alone: bool = True

    @property
    def floor_s(self) -> float:
        """The time of the smallest size measured: the latency every collective of the sweep pays."""
        return self.points[0][1] * 1e-6


# "Performance data shown in these examples should not be considered up-to-date" (the page, since
# SDK 2.10): they are the only measured collective times AWS publishes, and they disagree across
# releases (a 32-rank 1 KiB all-gather: 151 us at 2.10, 6.16 us at 2.24). The time model's rule for
# choosing among them is in readiness/estimate/collective_time.py.
# fmt: off
COLLECTIVE_SWEEPS = (
    CollectiveSweep(
        "all_reduce", "trn1", 2, 1, "2.10",
        ((1024, 58), (4096, 58), (16384, 58), (65536, 58), (262144, 60), (1 << 20, 68), (4 << 20, 107),
         (16 << 20, 332), (64 << 20, 1214), (256 << 20, 4750), (1 << 30, 18930)),
        f"{NCCOM_TEST}, SDK 2.10: nccom-test -r 2 --minbytes 1kb --maxbytes 1gb --stepfactor 4 --datatype fp32 allr",
        inferred="in May 2023 only trn1 and inf2 existed, and the page's 32-rank example needs a trn1.32xlarge",
    ),
    CollectiveSweep(
        "all_gather", "trn1", 32, 1, "2.10",
        ((1024, 151), (8192, 149), (65536, 150), (524288, 179)),
        f"{NCCOM_TEST}, SDK 2.10: nccom-test -r 32 ... allg --check (fp32)",
        inferred="32 ranks on one instance in May 2023: a trn1.32xlarge",
    ),
    CollectiveSweep(
        "all_gather", "trn1", 32, 1, "2.24",
        ((1024, 6.16), (8192, 6.48), (65536, 8.17), (524288, 23.16)),
        f"{NCCOM_TEST}, SDK 2.24: nccom-test ... -r 32 allg --show-input-output-size (fp32)",
        inferred="the Neuron Profiler 2.0 guide runs the same 32-rank all-gather on a trn1.32xlarge "
        "(24.15 us at 512 KiB)",
    ),
    CollectiveSweep(
        "all_reduce", "trn1", 64, 2, "2.10",
        ((8, 520), (16, 520), (32, 523), (64, 525), (128, 553), (256, 709), (512, 782), (1024, 840),
         (2048, 881), (4096, 916), (8192, 1013), (16384, 1031), (32768, 1174), (65536, 1315),
         (131072, 1315), (262144, 1311), (524288, 1312), (1 << 20, 1328), (2 << 20, 1329),
         (4 << 20, 1378), (8 << 20, 1419), (16 << 20, 2138), (32 << 20, 2711), (64 << 20, 3963),
         (128 << 20, 6279), (256 << 20, 11954), (512 << 20, 21803), (1 << 30, 41806)),
        f"{NCCOM_TEST}, SDK 2.10: nccom-test -r 64 -N 2 -b 8 -e 1GB -f 2 -n 50 -w 5 -d fp32 allr "
        "(32 ranks on each of two hosts, over EFA)",
        inferred="32 ranks per host in May 2023: trn1.32xlarge",
    ),
    CollectiveSweep(
        "all_reduce", "trn2", 16, 1, "2.28",
        ((4, 299.91), (32, 299.69), (512, 299.82), (8192, 299.74), (131072, 574.15), (2 << 20, 686.32),
         (32 << 20, 2754.15), (512 << 20, 9689.51)),
        f"{NCCOM_TEST}, SDK 2.28: nccom-test -r 16 allr -b 4 -e 1gb -f 16 -d fp32 --show-algorithm "
        "(mesh to 128 KiB, rdh at 2 MiB, kangaring above)",
        inferred="KangaRing is a Trainium2 algorithm (pairs of LNC=2 ranks on one chip)",
    ),
    CollectiveSweep(
        "all_reduce", "trn2", 16, 1, "2.32",
        ((1024, 101.14), (2048, 101.93), (4096, 101.45), (8192, 101.84), (16384, 102.21), (32768, 102.36),
         (65536, 103.28), (131072, 105.03), (262144, 107.37), (524288, 110.07), (1 << 20, 117.67)),
        f"{NCCOM_TEST}, SDK 2.32: nccom-test allg -r 64 -c --streams-json (stream 0: bf16 all-reduce over "
        "four 16-rank groups, while stream 1 all-gathers 1 KiB over all 64 ranks)",
        inferred="64 ranks on one instance with 16-rank groups: a trn2.48xlarge at LNC=2",
        alone=False,
    ),
)
# fmt: on
# Left out: examples whose hardware neither the page nor its release implies (an 8-rank all-gather
# and an 8-rank permute, SDK 2.28; a 4-rank all-gatherv, SDK 2.32) and a 2-rank all-to-allv across
# two instances whose payload is a few bytes (its 955 us is setup, not a sweep).

# EFA: "When measured with the RDMA core performance test ib_write_lat, a minimal packet takes
# 15us (latency) to go from an HBM in one server to an HBM of another" (Trn2 on the 10p10u
# network; "What is Neuron Collective Communication?", neuron-runtime/about/collectives.rst, 2025-12).
EFA_HOP_LATENCY_S = 15e-6

# Tensor Engine, achieved: the NKI matmul tutorial's fully optimised kernel (SDK 2.20-2.26,
# general/nki/tutorials/matrix_multiplication.rst): [4096, 8192] @ [8192, 8192] in BF16 with FP32
# accumulation on one NeuronCore-v2 of a trn1.32xlarge, 6.97 ms (the page's "HFU of 85.2%" is the
# profiler's, over a window other than the latency; the latency is used).
TENSOR_ENGINE_MATMUL = {"chip": "trn1", "m": 4096, "k": 8192, "n": 8192, "dtype": "bfloat16", "seconds": 6.97e-3}

# DMA throughput by bytes per partition, 128 partitions, relative to 32 KiB per partition (the
# figure "DMA Throughput varying Bytes per Partition for p_dim = 128", "Introduction to DMA with
# NKI", nki/get-started/about/nki-dma-overview.rst, 2025-12; read off the plot, whose y-axis has
# no scale: only the ratios are AWS's). "At 4096 free bytes, we are able to nearly saturate".
DMA_BYTES_PER_PARTITION_CURVE = (
    (32, 0.018), (64, 0.028), (128, 0.054), (256, 0.104), (512, 0.210), (1024, 0.425), (2048, 0.814),
    (4096, 0.968), (8192, 0.983), (16384, 0.992), (32768, 1.0),
)  # fmt: skip

# Not a constant here: the NKI performance guide's "sufficiently large DMA transfers, achieving close
# 70% DMA throughput utilization" (nki/deep-dives/nki_perf_guide.rst, since SDK 2.20) describes one
# kernel's profile, not the engines: the DMA bandwidth guide's measured transfer (32 KiB HBM to SBUF in
# 1,416 ns on one trn2 engine, 23.1 B/ns) runs at the table's sustained rate, which the model uses.
