"""Streams and events (synchronous execution, real timing)."""

import time

import pytest
import torch


def test_stream_objects():
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.neuron.Stream)
    assert s.device.type == "neuron"
    default = torch.neuron.default_stream()
    assert torch.neuron.current_stream() == default
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.neuron.current_stream() == default
    s.synchronize()
    assert s.query()


def test_event_elapsed_time_is_real():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    assert isinstance(start, torch.neuron.Event)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert start.query()
    assert 45 <= start.elapsed_time(end) < 1000


def test_event_requires_timing_and_record():
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        a.elapsed_time(b)
    c, d = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        c.elapsed_time(d)


def test_wait_stream_and_event():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    e = s1.record_event()
    s2.wait_event(e)
    s2.wait_stream(s1)
    torch.neuron.current_stream().wait_stream(s1)
    x = torch.ones(2, device="neuron")
    x.record_stream(s1)
