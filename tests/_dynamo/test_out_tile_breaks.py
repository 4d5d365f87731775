"""The demo's two graph breaks under torch.compile are Dynamo's, on every device.

TRL's SFTTrainer computes the loss with its chunked LM head (``trl.kernels.chunked_logprob.ChunkedLogProbFunction``),
which writes each vocabulary tile's logits with ``torch.mm(..., out=tile)`` into a slice of
a ``[tokens, 32768]`` buffer. With a vocabulary smaller than (or not a multiple of) the
32,768-column chunk the slice is not contiguous, and Dynamo refuses a non-contiguous
``out=`` on any device (it cannot functionalize its strides). Neuron breaks exactly where
CPU's Inductor does, and a contiguous tile does not break on neuron.
"""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

chunked_logprob = pytest.importorskip("trl.kernels.chunked_logprob")


def _breaks(device, backend, vocab, chunk):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    hidden = torch.randn(6, 16).to(device)
    weight = torch.randn(vocab, 16).to(device)
    targets = torch.randint(0, vocab, (6,)).to(device)

    @torch.compile(backend=backend)
    def logprobs(h, w, t):
        return chunked_logprob.ChunkedLogProbFunction.apply(h, w, None, t, 1.0, chunk)[0]

    got = logprobs(hidden, weight, targets)
    expected = chunked_logprob.ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, chunk)[0]
    torch.testing.assert_close(got.cpu(), expected.cpu())
    return dict(counters["graph_break"])


def test_noncontiguous_out_tile_breaks_on_neuron_as_on_cpu():
    neuron = _breaks("neuron", "neuron", vocab=40, chunk=64)  # a 40-column slice of 64-column rows
    cpu = _breaks("cpu", "inductor", vocab=40, chunk=64)
    assert neuron == cpu, (neuron, cpu)
    assert any("non-contiguous `out=` tensor" in reason for reason in neuron), neuron


def test_contiguous_out_tile_does_not_break_on_neuron():
    assert _breaks("neuron", "neuron", vocab=64, chunk=64) == {}
