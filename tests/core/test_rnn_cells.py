"""RNN cells and layers on neuron equal CPU, forward and backward.

PyTorch calls the fused cell kernels (``_thnn_fused_lstm_cell``,
``_thnn_fused_gru_cell`` and their backwards) on every device but CPU; neuron
provides them, computing what CPU's decomposition computes.
"""

import pytest
import torch

TOL = dict(rtol=1e-5, atol=1e-6)


def _run(module, inputs, device):
    module = module.to(device)
    inputs = [t.detach().to(device).requires_grad_(t.is_floating_point()) for t in inputs]
    out = module(*inputs)
    flat = [out] if isinstance(out, torch.Tensor) else [t for o in out for t in (o if isinstance(o, tuple) else (o,))]
    torch.manual_seed(1)
    loss = sum((t * torch.randn(t.shape).to(device)).sum() for t in flat)
    loss.backward()
    grads = [t.grad for t in inputs] + [p.grad for p in module.parameters()]
    return [t.detach().cpu() for t in flat], [g.cpu() for g in grads]


CASES = {
    "GRUCell": (lambda: torch.nn.GRUCell(5, 7), lambda: [torch.randn(3, 5), torch.randn(3, 7)]),
    "GRUCell-nobias-nohx": (lambda: torch.nn.GRUCell(5, 7, bias=False), lambda: [torch.randn(3, 5)]),
    "LSTMCell": (lambda: torch.nn.LSTMCell(5, 7), lambda: [torch.randn(3, 5)]),
    "LSTMCell-nobias": (lambda: torch.nn.LSTMCell(5, 7, bias=False), lambda: [torch.randn(3, 5)]),
    "RNNCell": (lambda: torch.nn.RNNCell(5, 7), lambda: [torch.randn(3, 5)]),
    "GRU": (lambda: torch.nn.GRU(5, 7, num_layers=2, bidirectional=True), lambda: [torch.randn(4, 3, 5)]),
    "LSTM": (lambda: torch.nn.LSTM(5, 7, num_layers=2, batch_first=True), lambda: [torch.randn(3, 4, 5)]),
    "LSTM-proj": (lambda: torch.nn.LSTM(5, 7, proj_size=3), lambda: [torch.randn(4, 3, 5)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rnn_matches_cpu(name):
    make_module, make_inputs = CASES[name]
    torch.manual_seed(0)
    module, inputs = make_module(), make_inputs()
    cpu_out, cpu_grads = _run(module, inputs, "cpu")
    module.zero_grad()
    out, grads = _run(module, inputs, "neuron")
    for a, b in zip(out, cpu_out):
        torch.testing.assert_close(a, b, **TOL)
    assert len(grads) == len(cpu_grads)
    for a, b in zip(grads, cpu_grads):
        torch.testing.assert_close(a, b, **TOL)


def test_fused_cells_run_on_neuron():
    # The fused kernels themselves, against CPU's decomposition of the same gates.
    torch.manual_seed(0)
    ig, hg, cx = torch.randn(2, 12), torch.randn(2, 12), torch.randn(2, 3)
    ib, hb = torch.randn(12), torch.randn(12)
    hy, cy, ws = torch.ops.aten._thnn_fused_lstm_cell(*(t.to("neuron") for t in (ig, hg, cx, ib, hb)))
    i, f, g, o = ((ig + ib) + (hg + hb)).chunk(4, 1)
    ref_cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    torch.testing.assert_close(cy.cpu(), ref_cy, **TOL)
    torch.testing.assert_close(hy.cpu(), o.sigmoid() * ref_cy.tanh(), **TOL)
    assert ws.shape == (2, 12)
    hx = torch.randn(2, 4)
    hy, ws = torch.ops.aten._thnn_fused_gru_cell(*(t.to("neuron") for t in (ig, hg, hx, ib, hb)))
    assert ws.shape == (2, 20)
    r, z, n = (ig + ib).chunk(3, 1)
    hr, hz, hn = (hg + hb).chunk(3, 1)
    new = (n + (hr + r).sigmoid() * hn).tanh()
    torch.testing.assert_close(hy.cpu(), (hx - new) * (hz + z).sigmoid() + new, **TOL)


def test_fused_cell_shape_errors():
    a = torch.randn(2, 12, device="neuron")
    with pytest.raises(RuntimeError, match="expected a state of shape \\[2, 3\\]"):
        torch.ops.aten._thnn_fused_lstm_cell(a, a, torch.randn(2, 4, device="neuron"))
    with pytest.raises(RuntimeError, match="input_gates and hidden_gates"):
        torch.ops.aten._thnn_fused_gru_cell(a, a[:, :9], torch.randn(2, 4, device="neuron"))
