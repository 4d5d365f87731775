"""The time model's constants come from AWS's published measurements of primitives
(neuronsim.measured): each term against a case computed here by hand from the published figure."""

import pytest

from neuronsim import hardware as hw
from neuronsim import measured, neuroncore
from torch_neuronx.readiness.estimate import collective_time as ct
from torch_neuronx.readiness.estimate import time_model

US = 1e-6


def _sweep(chip, op, ranks, sdk, instances=1):
    return next(
        s
        for s in measured.COLLECTIVE_SWEEPS
        if (s.chip, s.op, s.ranks, s.sdk, s.instances) == (chip, op, ranks, sdk, instances)
    )


# -- collectives ------------------------------------------------------------------------------
def test_a_small_all_reduce_takes_the_latest_measured_floor_at_2_16_and_32_ranks():
    trn1 = time_model.core_figures("trn1", 1, "trn1.32xlarge")
    trn2 = time_model.core_figures("trn2", 2, "trn2.48xlarge")
    # trn1: SDK 2.24 measured a 32-rank all-gather of 1 KiB in 6.16 us, and no all-reduce; 2.10's
    # 58 us 2-rank all-reduce is older. An all-reduce is a reduce-scatter and an all-gather.
    for n in (2, 32):
        t, lat, bw = ct.collective_time(trn1, "allreduce", 1024, n)
        assert lat == pytest.approx(2 * 6.16 * US) and t == pytest.approx(2 * 6.16 * US)
    assert ct.sweep_for("trn1", "all_reduce", 2, 1, 1024) is _sweep("trn1", "all_gather", 32, "2.24")
    # trn2: SDK 2.32 measured a 16-rank all-reduce of 1 KiB in 101.14 us (with another stream
    # running: an upper bound), newer than 2.28's ~300 us alone
    assert ct.collective_time(trn2, "allreduce", 1024, 16)[0] == pytest.approx(101.14 * US)
    # 64 ranks: the same bytes per rank as 1,075 B on 16, just above the floor (no rule of hops)
    assert ct.collective_time(trn2, "allreduce", 1024, 64)[0] == pytest.approx(101.14 * US, rel=1e-3)
    # an all-gather from that all-reduce sweep: half an all-reduce of the same bytes per rank
    assert ct.collective_time(trn2, "all_gather_into_tensor", 1024, 16)[0] == pytest.approx(101.14 / 2 * US)


def test_between_and_beyond_measured_sizes():
    trn1 = time_model.core_figures("trn1", 1, "trn1.32xlarge")
    # a measured point is its time: 512 KiB gathered over 32 ranks in 23.16 us (SDK 2.24)
    assert ct.collective_time(trn1, "all_gather_into_tensor", 512 << 10, 32)[0] == pytest.approx(23.16 * US)
    # linear between 64 KiB (8.17 us) and 512 KiB
    mid = (64 << 10) + ((512 << 10) - (64 << 10)) // 2
    assert ct.collective_time(trn1, "all_gather_into_tensor", mid, 32)[0] == pytest.approx((8.17 + 23.16) / 2 * US)
    # beyond the newest sweep's sizes, the release that measured them: 2.10's 1 GiB 2-rank all-reduce
    assert ct.collective_time(trn1, "allreduce", 1 << 30, 2)[0] == pytest.approx(18930 * US)
    # beyond every sweep, the chip's highest measured bus bandwidth (52.83 GiB/s at 1 GiB) carries the rest
    rate = (1 << 30) * 1.0 / (18930 * US)
    t = ct.collective_time(trn1, "allreduce", 2 << 30, 2)[0]
    assert t == pytest.approx(18930 * US + (1 << 30) / rate)


def test_groups_across_instances_use_the_sweep_of_their_shape_or_efa_hops():
    trn1 = time_model.core_figures("trn1", 1, "trn1.32xlarge")
    # 32 ranks on each of 2 instances: SDK 2.10's 64-rank sweep (520 us at 8 B, 41.8 ms at 1 GiB)
    assert ct.collective_time(trn1, "allreduce", 8, 64, instances=2)[0] == pytest.approx(520 * US)
    assert ct.collective_time(trn1, "allreduce", 1 << 30, 64, instances=2)[0] == pytest.approx(41806 * US)
    # one rank per instance (data parallelism over tensor-parallel instances): no sweep of that
    # shape; a ring over EFA, each hop the measured 15 us of one RDMA packet, at the rank's share
    nbytes = 4 << 20
    t, lat, bw = ct.collective_time(trn1, "all_gather_into_tensor", nbytes, 4, instances=4)
    assert lat == pytest.approx(3 * measured.EFA_HOP_LATENCY_S)
    assert bw == pytest.approx(3 / 4 * nbytes / trn1["efa_bytes_per_s"]) and trn1["efa_bytes_per_s"] == 800e9 / 8 / 32
    one_chip = time_model.core_figures("trn1", 1, "trn1.2xlarge")
    with pytest.raises(hw.MissingFigure, match="no EFA figure"):
        ct.collective_time(one_chip, "all_gather_into_tensor", nbytes, 4, instances=4)


def test_without_a_measurement_collectives_follow_awss_description():
    # trn3: no nccom-test sweep. Inside an instance, the runtime's algorithm by size at 2 us a hop.
    fig = time_model.core_figures("trn3", 2, "trn3.48xlarge")
    hop = ct.INTRANODE_HOP_LATENCY_S
    assert ct.collective_time(fig, "allreduce", 32 << 10, 64)[1] == pytest.approx(4 * hop)  # Mesh: 2 + 2
    assert ct.collective_time(fig, "allreduce", 8 << 20, 64)[1] == pytest.approx(10 * hop)  # RDH: 1 + log2(16), x2
    assert ct.collective_time(fig, "allreduce", 300 << 20, 64)[1] == pytest.approx(62 * hop)  # KangaRing
    plain = time_model.core_figures("trn3", 2)  # no instance: a ring
    link, nbytes = plain["link_bytes_per_s"], 8 << 20
    assert ct.collective_time(plain, "allreduce", 1024, 16)[1] == pytest.approx(30 * hop)
    assert ct.collective_time(plain, "broadcast", nbytes, 8)[1:] == pytest.approx((7 * hop, nbytes / link))
    assert ct.collective_time(plain, "gather", nbytes, 8)[2] == pytest.approx(7 / 8 * nbytes / link)
    assert ct.collective_time(plain, "barrier", 4, 8)[1:] == pytest.approx((14 * hop, 0.0))
    # point to point on any chip: one hop and the buffer
    trn2 = time_model.core_figures("trn2", 2, "trn2.48xlarge")
    assert ct.collective_time(trn2, "send", nbytes, 8)[1:] == pytest.approx((hop, nbytes / trn2["link_bytes_per_s"]))
    assert not ct.is_approximated("broadcast") and ct.is_approximated("some_new_collective")


def test_the_assumptions_name_every_sweep_the_rule_can_pick():
    (line, *_) = ct.assumptions()
    assert "trn1 all-gather of 32 ranks (SDK 2.24, 6.16 us floor)" in line
    assert "trn1 all-reduce of 64 ranks on 2 instances (SDK 2.10, 520 us floor)" in line
    assert "trn2 all-reduce of 16 ranks (SDK 2.32, 101.14 us floor)" in line
    # SDK 2.10's 32-rank all-gather: measured again at 2.24 over the same sizes, never picked
    assert "(SDK 2.10, 151 us floor)" not in line


# -- the Tensor Engine and DMA ------------------------------------------------------------------
def test_a_large_matmul_runs_at_the_published_efficiency():
    fig = time_model.core_figures("trn1", 1)
    m, k, n = 4096, 8192, 8192
    flops, nbytes = 2 * m * k * n, 2 * (m * k + k * n + m * n)
    t, parts = time_model.op_time(fig, "tensor", "bfloat16", flops, nbytes, 3)
    # the tutorial's 6.97 ms for this matmul, plus the launch's three transfers' fixed costs
    assert parts["compute"] == pytest.approx(6.97e-3) and t == pytest.approx(6.97e-3 + parts["fixed"])
    assert time_model.TENSOR_ENGINE_EFFICIENCY == pytest.approx(flops / 95e12 / 6.97e-3)  # 83.0%
    assert 0.82 < time_model.TENSOR_ENGINE_EFFICIENCY < 0.84


def test_a_transfer_below_32_kib_runs_at_a_fraction_of_the_dma_rate_and_above_at_all_of_it():
    fig = time_model.core_figures("trn2", 2)
    rate = fig["memory_bytes_per_s"]
    # 4 KiB over 128 partitions: 32 B each, 1.8% of a saturating transfer's throughput
    small = time_model.op_time(fig, "vector", "bfloat16", 0, 4096, 1)[1]["memory"]
    assert small == pytest.approx(4096 / (rate * 0.018))
    # 2 KiB per partition (256 KiB): 81.4%; 32 KiB per partition (4 MiB) and beyond: all of it
    assert neuroncore.dma_efficiency(256 << 10) == pytest.approx(0.814)
    large = time_model.op_time(fig, "vector", "bfloat16", 0, 4 << 20, 1)[1]["memory"]
    assert large == pytest.approx((4 << 20) / rate)
    # between measured sizes, linear: 3 KiB per partition lies halfway between 81.4% and 96.8%
    assert neuroncore.dma_efficiency(3 * 1024 * 128) == pytest.approx((0.814 + 0.968) / 2)


def test_aws_measured_dma_transfer_is_reproduced_by_the_sustained_rate():
    """The one DMA transfer AWS timed (trn2, 32 KiB HBM to SBUF over 4 partitions on one engine,
    1,416 ns) ran at the sustained per-engine rate the hardware table uses (23 B/ns)."""
    per_engine = hw.CHIPS["trn2"].dma_bytes_per_s_per_engine
    modelled = (32 << 10) / (per_engine * neuroncore.dma_efficiency(32 << 10, partitions=4))
    assert modelled == pytest.approx(1416e-9, rel=0.05)
