"""Per-core HBM accounting and out-of-memory behaviour."""

import pytest
import torch

GiB = 2**30


def test_allocation_is_accounted_on_its_core():
    torch.neuron.synchronize()
    before = [torch.neuron.memory_allocated(i) for i in range(4)]
    t = torch.empty(1 << 20, dtype=torch.uint8, device="neuron:2")
    assert torch.neuron.memory_allocated(2) == before[2] + (1 << 20)
    assert torch.neuron.memory_allocated(1) == before[1]
    assert torch.accelerator.memory_allocated(2) == torch.neuron.memory_allocated(2)
    del t
    assert torch.neuron.memory_allocated(2) == before[2]


def test_results_of_ops_are_device_memory():
    x = torch.ones(1000, device="neuron:1")
    before = torch.neuron.memory_allocated(1)
    y = x * 2  # produced by the CPU kernel, adopted as device memory
    assert torch.neuron.memory_allocated(1) == before + 4000
    del y
    assert torch.neuron.memory_allocated(1) == before


def test_out_of_memory_is_typed_and_harmless():
    x = torch.ones(10, device="neuron:0")
    torch.neuron.reset_peak_memory_stats(0)
    before = torch.neuron.memory_stats(0)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(25 * GiB, dtype=torch.uint8, device="neuron:0")
    msg = str(info.value)
    assert "neuron:0" in msg and "25.00 GiB" in msg and "24.00 GiB" in msg and "free" in msg
    after = torch.neuron.memory_stats(0)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert torch.equal((x + 1).cpu(), torch.full((10,), 2.0))  # still works


def test_out_of_memory_inside_an_op():
    big = torch.empty(13 * GiB, dtype=torch.uint8, device="neuron:3")  # not touched: lazily paged
    with pytest.raises(torch.OutOfMemoryError):
        big.clone()
    assert torch.neuron.memory_allocated(3) == 13 * GiB
    del big
    assert torch.neuron.memory_allocated(3) == 0


def test_capacity_is_per_core():
    a = torch.empty(13 * GiB, dtype=torch.uint8, device="neuron:0")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(13 * GiB, dtype=torch.uint8, device="neuron:0")
    b = torch.empty(13 * GiB, dtype=torch.uint8, device="neuron:1")  # another core: fits
    free, total = torch.neuron.mem_get_info(0)
    assert total == 24 * GiB and free == total - torch.neuron.memory_reserved(0)
    assert torch.accelerator.get_memory_info(1) == torch.neuron.mem_get_info(1)
    del a, b


def test_peak_and_reset():
    torch.neuron.reset_peak_memory_stats(1)
    base = torch.neuron.memory_allocated(1)
    t = torch.empty(4096, dtype=torch.uint8, device="neuron:1")
    del t
    assert torch.neuron.max_memory_allocated(1) == base + 4096
    assert torch.accelerator.max_memory_allocated(1) == base + 4096
    torch.neuron.reset_peak_memory_stats(1)
    assert torch.neuron.max_memory_allocated(1) == base
    stats = torch.neuron.memory_stats(1)
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.peak",
        "active_bytes.all.allocated",
        "num_alloc_retries",
        "num_ooms",
        "allocation.all.freed",
        "allocation.all.allocated",
    ):
        assert key in stats
    torch.neuron.reset_accumulated_memory_stats(1)
    assert torch.neuron.memory_stats(1)["allocation.all.allocated"] == 0
    assert "Neuron memory summary" in torch.neuron.memory_summary(1)
    torch.neuron.empty_cache()


def test_a_host_kernels_scratch_is_not_in_the_peak():
    """CPU's matmul copies a strided operand to a contiguous buffer and frees it before it returns:
    host scratch, which a NeuronCore's kernel does not have (and a dry run does not count), so the
    peak is the inputs and the result only, on any host CPU."""
    a = torch.randn(512, 1024, device="neuron:1")[:, ::2]  # strided: CPU's gemm copies it first
    b = torch.randn(512, 512, device="neuron:1")
    torch.neuron.reset_peak_memory_stats(1)
    base = torch.neuron.memory_allocated(1)
    c = a @ b
    assert torch.neuron.memory_allocated(1) == base + c.nbytes
    assert torch.neuron.max_memory_allocated(1) == base + c.nbytes  # was base + 2 * c.nbytes
    assert torch.equal(c.cpu(), a.cpu() @ b.cpu())


def test_resize_grows_on_the_device():
    t = torch.ones(4, device="neuron:2")
    before = torch.neuron.memory_allocated(2)
    t.resize_(1000)
    assert torch.neuron.memory_allocated(2) == before - 16 + 4000
    assert torch.equal(t[:4].cpu(), torch.ones(4))
    s = torch.ones(2, device="neuron:2").untyped_storage()
    s.resize_(64)
    assert s.nbytes() == 64


def test_freed_small_blocks_are_cached_and_reused():
    torch.neuron.empty_cache()
    reserved, allocated = torch.neuron.memory_reserved(2), torch.neuron.memory_allocated(2)
    x = torch.empty(1000, dtype=torch.uint8, device="neuron:2")
    ptr = x.data_ptr()
    # allocated counts the bytes asked for, reserved the block (size class 1 KiB).
    assert torch.neuron.memory_allocated(2) == allocated + 1000
    assert torch.neuron.memory_reserved(2) == reserved + 1024
    del x
    assert torch.neuron.memory_allocated(2) == allocated
    assert torch.neuron.memory_reserved(2) == reserved + 1024  # kept for reuse
    y = torch.empty(250, dtype=torch.float32, device="neuron:2")  # same size class
    assert y.data_ptr() == ptr
    assert torch.neuron.memory_reserved(2) == reserved + 1024
    stats = torch.neuron.memory_stats(2)
    assert stats["reserved_bytes.all.current"] == reserved + 1024
    assert stats["allocated_bytes.all.current"] == allocated + 1000
    del y
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved(2) == reserved
    assert torch.neuron.memory_allocated(2) == allocated


def test_large_blocks_are_not_cached():
    torch.neuron.empty_cache()
    reserved = torch.neuron.memory_reserved(3)
    x = torch.empty((64 << 20) + 1, dtype=torch.uint8, device="neuron:3")  # above the largest size class
    assert torch.neuron.memory_reserved(3) == reserved + (64 << 20) + 1
    del x
    assert torch.neuron.memory_reserved(3) == reserved


def test_cache_is_released_before_out_of_memory():
    torch.neuron.empty_cache()
    blocks = [torch.empty(3 << 20, dtype=torch.uint8, device="neuron:1") for _ in range(8)]
    del blocks
    cached = torch.neuron.memory_reserved(1) - torch.neuron.memory_allocated(1)
    assert cached >= 24 << 20
    retries = torch.neuron.memory_stats(1)["num_alloc_retries"]
    # Untouched memory is paged lazily; two halves keep each host request modest.
    half = torch.empty(12 * GiB, dtype=torch.uint8, device="neuron:1")
    free, _ = torch.neuron.mem_get_info(1)
    # Fits only once the cached blocks go back to the core.
    big = torch.empty(free + (4 << 20), dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_stats(1)["num_alloc_retries"] == retries + 1
    assert torch.neuron.memory_reserved(1) - torch.neuron.memory_allocated(1) < cached
    del big, half
    with pytest.raises(torch.OutOfMemoryError, match="reserved by PyTorch but unallocated"):
        torch.empty(25 * GiB, dtype=torch.uint8, device="neuron:1")


def test_accelerator_empty_cache_releases_every_core():
    xs = [torch.empty(100, device=f"neuron:{i}") for i in range(4)]
    del xs
    assert any(torch.neuron.memory_reserved(i) > torch.neuron.memory_allocated(i) for i in range(4))
    torch.accelerator.empty_cache()
    assert all(torch.neuron.memory_reserved(i) >= torch.neuron.memory_allocated(i) for i in range(4))
    assert torch.accelerator.memory_reserved(0) == torch.neuron.memory_reserved(0)


def test_memory_stats_are_the_accelerator_device_stats():
    t = torch.ones(257, device="neuron:1")
    stats = torch.neuron.memory_stats(1)
    accel = dict(torch.accelerator.memory_stats(1))
    assert {k: stats[k] for k in accel} == accel
    # The real TorchNeuron's names of two counters, beside CUDA's.
    assert stats["allocation_requests"] == accel["allocation.all.allocated"] > 0
    assert stats["num_tensor_frees"] == accel["allocation.all.freed"]
    assert set(stats) - set(accel) == {"allocation_requests", "num_tensor_frees"}
    assert torch.neuron.memory_stats("neuron:1")["allocated_bytes.all.current"] == torch.accelerator.memory_allocated(1)
    del t


def test_invalid_device_index_has_one_message():
    torch.ones(1, device="neuron")  # torch.accelerator.memory_stats reads nothing before the first allocation
    n = torch.neuron.device_count()
    expected = f"Invalid device index neuron:{n}: this process sees {n} neuron devices"
    for call in (
        torch.neuron.memory_stats,
        torch.neuron.memory_allocated,
        torch.neuron.mem_get_info,
        torch.neuron.get_device_properties,
        torch.neuron.synchronize,
        torch.neuron.set_device,
        torch.accelerator.memory_stats,
    ):
        with pytest.raises(IndexError, match=expected):
            call(n)
    with pytest.raises(IndexError, match=expected):
        torch.empty(1, device=f"neuron:{n}")
