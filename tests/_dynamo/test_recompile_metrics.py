"""Backend metrics count recompilations as Dynamo does, limit hits included."""

import logging

import pytest
import torch

DEV = "neuron"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def dynamo_logs():
    """Dynamo's own recompile messages and warnings, as TORCH_LOGS="recompiles" shows them."""
    h = _Records()
    loggers = [logging.getLogger("torch._dynamo.guards.__recompiles"), logging.getLogger("torch._dynamo.convert_frame")]
    torch._logging.set_logs(recompiles=True)
    for lg in loggers:
        lg.addHandler(h)
    try:
        yield h.messages
    finally:
        for lg in loggers:
            lg.removeHandler(h)
        torch._logging.set_logs()


def test_recompilations_agree_with_dynamo_including_the_recompile_limit(dynamo_logs):
    torch.neuron.reset_dynamo_metrics()
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend="neuron", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in (4, 5, 6):  # 6: Dynamo hits its limit and runs the frame eagerly
            x = torch.randn(n, 3, device=DEV)
            torch.testing.assert_close(fn(x), torch.tanh(x) * 2)
    m = torch.neuron.get_dynamo_metrics()
    dynamo_recompiles = sum(msg.startswith("Recompiling function") for msg in dynamo_logs)
    assert dynamo_recompiles == 2, dynamo_logs
    assert any("hit config.recompile_limit (2)" in msg for msg in dynamo_logs), dynamo_logs
    assert m["dynamo_recompiles"] == m["num_recompilations"] == dynamo_recompiles, m
    assert m["graphs_compiled"] == 2, m
    compiled, stopped = m["recompilations"]
    assert compiled["compiled"] and ((5, 3), "float32", "neuron:0") in compiled["shapes"], m
    assert not stopped["compiled"] and stopped["shapes"] is None and "size mismatch" in stopped["reason"], m
    assert "not compiled (Dynamo's recompile limit" in str(m)


def test_reset_zeroes_dynamo_recompiles():
    fn = torch.compile(lambda x: x + 1, backend="neuron", dynamic=False)
    for n in (2, 3):
        fn(torch.ones(n, device=DEV))
    assert torch.neuron.get_dynamo_metrics()["dynamo_recompiles"] == 1
    torch.neuron.reset_dynamo_metrics()
    m = torch.neuron.get_dynamo_metrics()
    assert m["dynamo_recompiles"] == 0 and m["recompilations"] == []
