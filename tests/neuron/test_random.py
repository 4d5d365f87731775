"""Per-device generators as AWS documents them: a 16-byte (seed, offset) state,
seedable, reproducible, thread-safe, independent of CPU's."""

import threading

import pytest
import torch

import torch_neuronx


def _seed_offset(state):
    return state[:8].view(torch.int64).item(), state[8:].view(torch.int64).item()


def test_manual_seed_seeds_the_device_reproducibly():
    torch.manual_seed(123)
    a = torch.randn(8, device="neuron")
    torch.manual_seed(123)
    b = torch.randn(8, device="neuron")
    c = torch.randn(8)
    assert torch.equal(a.cpu(), b.cpu())
    # Not CPU's stream: neuron draws from its own (seed, offset) generator.
    assert not torch.equal(a.cpu(), c)


def test_device_generator_independent_of_cpu_default():
    torch.manual_seed(0)
    torch.randn(1000)  # advance CPU only
    x = torch.randn(4, device="neuron")
    torch.manual_seed(0)
    y = torch.randn(4, device="neuron")
    assert torch.equal(x.cpu(), y.cpu())


def test_each_device_has_its_own_generator():
    torch.neuron.manual_seed_all(5)
    a0 = torch.rand(4, device="neuron:0")
    a0b = torch.rand(4, device="neuron:0")
    a1 = torch.rand(4, device="neuron:1")
    assert torch.equal(a0.cpu(), a1.cpu())
    assert not torch.equal(a0.cpu(), a0b.cpu())


def test_explicit_generator():
    g = torch.Generator("neuron")
    assert g.device.type == "neuron"
    g.manual_seed(7)
    a = torch.rand(5, device="neuron", generator=g)
    g.manual_seed(7)
    b = torch.rand(5, device="neuron", generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.Generator("neuron:2").device == torch.device("neuron", 2)


def test_dropout_reproducible():
    x = torch.randn(64, 64, device="neuron")
    torch.manual_seed(3)
    a = torch.nn.functional.dropout(x, 0.3)
    torch.manual_seed(3)
    b = torch.nn.functional.dropout(x, 0.3)
    assert torch.equal(a.cpu(), b.cpu())
    kept = (a != 0).float().mean().item()
    assert 0.6 < kept < 0.8


def test_cpu_equal_rng_opt_in_draws_cpus_stream():
    x = torch.randn(64, 64)
    with torch_neuronx.cpu_equal_rng():
        torch.manual_seed(3)
        on_cpu = torch.nn.functional.dropout(x, 0.3)
        torch.manual_seed(3)
        on_neuron = torch.nn.functional.dropout(x.to("neuron"), 0.3)
        assert torch.equal(on_neuron.cpu(), on_cpu)
        assert torch.neuron.get_rng_state().numel() == torch.get_rng_state().numel()  # CPU's 5,056 bytes
        state = torch.neuron.get_rng_state()
        a = torch.randn(4, device="neuron")
        torch.neuron.set_rng_state(state)
        assert torch.equal(torch.randn(4, device="neuron").cpu(), a.cpu())
    assert torch.neuron.get_rng_state().numel() == 16


def test_rng_state_is_16_bytes_seed_then_offset():
    torch.neuron.manual_seed(11)
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8 and state.numel() == 16
    assert _seed_offset(state) == (11, 0)
    torch.rand(5, device="neuron")  # 5 values: the offset advances by a multiple of 4
    assert _seed_offset(torch.neuron.get_rng_state()) == (11, 8)
    torch.randn(2, 3, device="neuron")
    assert _seed_offset(torch.neuron.get_rng_state()) == (11, 16)
    g = torch.Generator("neuron").manual_seed(5)
    assert g.get_offset() == 0
    torch.rand(4, device="neuron", generator=g)
    assert g.get_offset() == 4 and g.initial_seed() == 5


def test_offset_selects_the_numbers():
    """What DTensor's tracker relies on: same (seed, offset), same numbers; other offset, others."""
    g = torch.Generator("neuron").manual_seed(9)
    a = torch.rand(8, device="neuron", generator=g)
    g.set_offset(0)
    assert torch.equal(torch.rand(8, device="neuron", generator=g).cpu(), a.cpu())
    g.set_offset(64)
    assert not torch.equal(torch.rand(8, device="neuron", generator=g).cpu(), a.cpu())
    state = g.get_state()
    state[8:] = torch.tensor([0], dtype=torch.int64).view(torch.uint8)
    g.set_state(state)
    assert torch.equal(torch.rand(8, device="neuron", generator=g).cpu(), a.cpu())


def test_unseeded_generators_start_from_a_nondeterministic_seed():
    seeds = {torch.Generator("neuron").initial_seed() for _ in range(4)}
    assert len(seeds) == 4


def test_set_state_rejects_a_cpu_state():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.neuron.set_rng_state(torch.get_rng_state())


def test_rng_state_round_trip():
    torch.neuron.manual_seed(11)
    state = torch.neuron.get_rng_state()
    a = torch.randn(3, device="neuron")
    torch.neuron.set_rng_state(state)
    b = torch.randn(3, device="neuron")
    assert torch.equal(a.cpu(), b.cpu())
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    torch.neuron.set_rng_state_all(states)
    assert torch.neuron.initial_seed() == 11
    torch.neuron.seed()
    torch.neuron.seed_all()


def test_fork_rng_restores_the_neuron_generator():
    torch.manual_seed(2)
    before = torch.neuron.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.rand(10, device="neuron")
    assert torch.equal(torch.neuron.get_rng_state(), before)


def test_rng_state_calls_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    state = torch.neuron.get_rng_state()
    with FakeTensorMode():
        torch.neuron.set_rng_state(state)
        got = torch.neuron.get_rng_state()
        torch.neuron.manual_seed(4)
        torch.manual_seed(4)
        with torch.random.fork_rng(devices=[0], device_type="neuron"):
            torch.neuron.set_rng_state(state)
    assert torch.equal(got, state)
    assert _seed_offset(torch.neuron.get_rng_state()) == (4, 0)


def test_generator_thread_safety():
    g = torch.Generator("neuron")
    g.manual_seed(0)
    out = []

    def draw():
        for _ in range(50):
            out.append(torch.rand(100, device="neuron", generator=g).cpu())

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every draw reserved its own offset: no two identical (no races), 200 draws of 100.
    assert len({tuple(o.tolist()[:4]) for o in out}) == 200
    assert g.get_offset() == 200 * 100


def test_multinomial_and_randperm():
    def draw():
        torch.manual_seed(1)
        return torch.multinomial(torch.ones(10, device="neuron"), 5), torch.randperm(10, device="neuron")

    (a, p), (b, q) = draw(), draw()
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(p.cpu(), q.cpu())
    assert sorted(p.tolist()) == list(range(10))
    with torch_neuronx.cpu_equal_rng():
        a, p = draw()
        torch.manual_seed(1)
        assert torch.equal(a.cpu(), torch.multinomial(torch.ones(10), 5))
        assert torch.equal(p.cpu(), torch.randperm(10))


def test_activation_checkpointing_replays_the_dropout_masks():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(16, 16).to("neuron")
    x = torch.randn(8, 16, device="neuron", requires_grad=True)  # reentrant checkpoint needs one
    assert torch.neuron._initialized  # what torch.utils.checkpoint consults

    def block(t):
        return torch.nn.functional.dropout(lin(t), 0.3, training=True)

    grads = {}
    for mode in ("plain", "reentrant", "non-reentrant"):
        lin.zero_grad()
        torch.manual_seed(0)
        if mode == "plain":
            out = block(x)
        else:
            out = checkpoint(block, x, use_reentrant=mode == "reentrant")
        out.square().sum().backward()
        grads[mode] = lin.weight.grad.clone()
    assert torch.equal(grads["plain"], grads["reentrant"])
    assert torch.equal(grads["plain"], grads["non-reentrant"])


def test_cpu_random_op_with_a_neuron_generator_draws_on_the_host():
    """What Diffusers' randn_tensor does on neuron: a CPU randn given the neuron generator."""
    g = torch.Generator("neuron").manual_seed(0)
    a = torch.randn(2, 3, generator=g)
    assert a.device.type == "cpu" and g.get_offset() == 8
    g.manual_seed(0)
    assert torch.equal(torch.randn(2, 3, generator=g), a)
    assert torch.equal(torch.empty(2, 3).normal_(generator=g.manual_seed(0)), a)
    assert not torch.equal(torch.randn(2, 3, generator=g), a)  # the offset moved on
    with pytest.raises(RuntimeError, match="same device"):  # CPU tensors next to neuron ones still are an error
        torch.randn(4, device="neuron").add_(torch.randn(4))


LOCAL_TENSOR_EXAMPLE = """
import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
with LocalTensorMode(frozenset(range(4))):
    # Before any random op on a neuron mesh: DTensor creates no RNG tracker for a CPU mesh,
    # so this runs (the control PyTorch's ...WithLocalTensor tests pass on). Once a neuron
    # mesh's random op has created the tracker, CPU meshes go through it and fail as below.
    cpu_mesh = DeviceMesh("cpu", list(range(4)))
    r = distribute_tensor(torch.zeros(8, 4), cpu_mesh, [Shard(0)]).uniform_()
    assert all(((t >= 0) & (t < 1)).all() for t in r.to_local()._local_tensors.values())

    mesh = DeviceMesh("neuron", list(range(4)))
    torch.manual_seed(0)
    state = torch.neuron.get_rng_state()
    torch.neuron.set_rng_state(state)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.neuron.manual_seed(1)
    assert torch.equal(torch.neuron.get_rng_state(), state)

    x = torch.arange(32.0, device="neuron").view(8, 4)
    dt = distribute_tensor(x, mesh, [Shard(0)])
    assert torch.equal(dt.redistribute(mesh, [Replicate()]).to_local()._local_tensors[3].cpu(), x.cpu())

    def draw():
        g = torch.Generator("neuron").manual_seed(0)
        r = distribute_tensor(torch.zeros(8, 4, device="neuron"), mesh, [Shard(0)]).uniform_(generator=g)
        assert g.get_offset() == 32  # every rank moved past the whole tensor
        return [t.cpu() for t in r.to_local()._local_tensors.values()]

    shards = draw()
    assert all(not torch.equal(shards[0], s) for s in shards[1:])
    assert all(torch.equal(a, b) for a, b in zip(shards, draw()))
    try:  # with the default generator PyTorch's LocalTensor tracker asks CUDA for its device
        distribute_tensor(torch.zeros(8, 4, device="neuron"), mesh, [Shard(0)]).uniform_()
    except AssertionError as e:
        assert "CUDA" in str(e), e
    else:
        print("UPSTREAM FIXED")
dist.destroy_process_group()
print("LOCAL TENSOR OK")
"""


def test_local_tensor_mode_dtensor_on_a_neuron_mesh():
    """PyTorch's single-process DTensor testing mode (4 ranks, fake process group) on neuron."""
    from helpers import run_python, worker_env

    p = run_python(LOCAL_TENSOR_EXAMPLE, env=worker_env())
    assert p.returncode == 0 and "LOCAL TENSOR OK" in p.stdout, p.stdout + p.stderr[-4000:]
    # When this fails, PyTorch's LocalTensor RNG tracker handles non-CUDA devices: document it.
    assert "UPSTREAM FIXED" not in p.stdout
