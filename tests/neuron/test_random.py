"""Per-device generators: seedable, reproducible, independent of CPU's."""

import threading

import torch


def test_manual_seed_seeds_the_device_and_matches_cpu_stream():
    torch.manual_seed(123)
    a = torch.randn(8, device="neuron")
    torch.manual_seed(123)
    b = torch.randn(8, device="neuron")
    c = torch.randn(8)  # CPU's stream, same seed, same algorithm
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c)


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


def test_dropout_reproducible_and_equal_to_cpu():
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    on_cpu = torch.nn.functional.dropout(x, 0.3)
    torch.manual_seed(3)
    on_neuron = torch.nn.functional.dropout(x.to("neuron"), 0.3)
    assert torch.equal(on_neuron.cpu(), on_cpu)


def test_rng_state_round_trip():
    torch.neuron.manual_seed(11)
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
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
    g.manual_seed(0)
    serial = [torch.rand(100, generator=torch.Generator().manual_seed(0)) for _ in range(1)]
    # Every draw is a distinct slice of one stream: no two identical (no races).
    assert len({tuple(o.tolist()[:4]) for o in out}) == 200
    assert serial[0].shape == (100,)


def test_multinomial_and_randperm():
    torch.manual_seed(1)
    a = torch.multinomial(torch.ones(10, device="neuron"), 5)
    p = torch.randperm(10, device="neuron")
    torch.manual_seed(1)
    b = torch.multinomial(torch.ones(10), 5)
    q = torch.randperm(10)
    assert torch.equal(a.cpu(), b) and torch.equal(p.cpu(), q)


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
