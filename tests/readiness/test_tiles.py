"""The Tensor Engine's tiles in the time model: a matmul is timed by the tiles it occupies
(neuronsim.tensor_engine, the rules the NKI cost model uses too), computed here by hand."""

import pytest
import torch

import torch_neuronx
from neuronsim import hardware as hw
from neuronsim import tensor_engine as te
from torch_neuronx.readiness.estimate import time_model
from torch_neuronx.readiness.record import measure as _cost
from torch_neuronx.readiness.record.recording import OpCall

TRN2 = hw.CHIPS["trn2"]


def test_the_tile_shapes_are_the_same_on_every_chip():
    # the report's assumptions name one chip's tiles for all (a recording holds none: only shapes)
    shapes = {(c.partitions, c.gemm_stationary_fmax, c.gemm_moving_fmax) for c in hw.CHIPS.values()}
    assert shapes == {(128, 128, 512)}


def test_full_tiles_run_at_the_dense_peak():
    # 256 x 1024 @ 1024 x 1024: 8 K tiles x 2 stationary tiles x 2 moving tiles of 512 columns
    assert te.matmul_cycles(TRN2, 256, 1024, 1024) == 8 * 2 * 2 * 512
    assert te.occupancy(TRN2, [(256, 1024, 1024, 1)]) == 1.0


def test_a_narrow_shard_fills_a_fraction_of_the_tiles():
    # head dim 64 as the contraction (Q K^T of one head): half the 128 partitions idle
    assert te.occupancy(TRN2, [(512, 64, 512, 1)]) == pytest.approx(2.0)
    # 100 columns stationary against 512 moving: a 128-column tile, 1.28x; laid out the other way
    # (512 stationary in 4 tiles, 100 moving columns) it is 100 cycles per tile: also 1.0 x 4 x 100
    m, k, n = 100, 128, 512
    assert te.matmul_cycles(TRN2, m, k, n) == min(1 * 1 * 512, 4 * 1 * 100)
    assert te.occupancy(TRN2, [(m, k, n, 1)]) == pytest.approx(400 / (m * k * n / (128 * 128)))
    # one token (decode): 64 cycles at least per instruction of one column
    assert te.matmul_cycles(TRN2, 1, 4096, 4096) == 32 * 32 * 64
    assert te.occupancy(TRN2, [(1, 4096, 4096, 1)]) == pytest.approx(64.0)


def _call(name: str, args, flops: int) -> OpCall:
    """The recorder's OpCall of a matmul-like op: its FLOPs and its matmuls' shapes."""
    return OpCall(name, "bfloat16", "tensor", flops, 0, 0, _cost.matmul_shapes(name, args))


def test_an_op_is_timed_by_the_flops_its_tiles_occupy():
    fig = time_model.core_figures("trn2", 2)
    a, b = torch.empty(512, 64, device="meta"), torch.empty(64, 512, device="meta")
    flops = 2 * 512 * 64 * 512
    tiles = time_model.tile_flops(fig, _call("aten::mm", (a, b), flops))
    assert tiles == 2 * flops
    at_peak = time_model.op_time(fig, "tensor", "bfloat16", flops, 0, 0)[1]["compute"]
    tiled = time_model.op_time(fig, "tensor", "bfloat16", flops, 0, 0, tile_flops=tiles)[1]["compute"]
    # the untiled time: the FLOPs at the Tensor Engine's peak times its measured efficiency
    rate = fig["tensor_flops"]["bfloat16"] * time_model.TENSOR_ENGINE_EFFICIENCY
    assert tiled == pytest.approx(2 * at_peak) and at_peak == pytest.approx(flops / rate)
    # a convolution's shapes say nothing here: timed at its FLOPs
    assert _cost.matmul_shapes("aten::convolution", (a, b)) == ()
    assert time_model.tile_flops(fig, _call("aten::convolution", (a, b), flops)) is None


def test_attention_with_head_dim_64_occupies_half_the_partitions():
    q = torch.empty(2, 4, 256, 64, device="meta")
    name = "aten::_scaled_dot_product_flash_attention_for_cpu"
    # Q K^T contracts over 64 (2x), P V over 256 with 64 moving columns (64 cycles: 1x)
    expected = (2 * 256 * 64 * 256 * 2.0 + 2 * 256 * 256 * 64 * 1.0) / (2 * 2 * 256 * 256 * 64)
    fig = time_model.core_figures("trn2", 2)
    assert time_model.tile_flops(fig, _call(name, (q, q, q), 1000)) == round(1000 * expected)


def test_a_recording_holds_the_matmul_shapes_and_the_estimate_applies_each_chips_tiles():
    x = torch.randn(512, 64, device="neuron")
    w = torch.randn(64, 512, device="neuron")
    with torch_neuronx.readiness() as r:
        x @ w
    (call,) = [c for c in r.recording.buckets[-1].ops if c.op == "aten::mm"]
    assert call.flops == 2 * 512 * 64 * 512 and call.matmuls == ((512, 64, 512, 1),)
    for chip in ("trn1", "trn2", "trn3"):  # each chip's tiles, at estimate time
        fig = time_model.core_figures(chip, 1)
        assert time_model.tile_flops(fig, call) == 2 * call.flops
