"""torch.neuron.memory_summary(): every line of the table has the same width and column bars."""

import torch


def test_memory_summary_lines_and_columns_align():
    dev = torch.device("neuron", 0)
    torch.neuron.reset_accumulated_memory_stats(dev)
    # 1023 MiB in total through the allocator: the widest figure _fmt prints ("1023.00 MiB")
    for _ in range(3):
        t = torch.empty(341 << 20, dtype=torch.uint8, device=dev)
        del t
    lines = torch.neuron.memory_summary(dev).splitlines()
    assert len({len(line) for line in lines}) == 1, "\n".join(lines)
    assert all(line[0] == "|" and line[-1] == "|" for line in lines)
    rows = [line for line in lines if line.count("|") == 6]
    assert [r.split("|")[1].strip() for r in rows] == [
        "Metric",
        "Allocated memory",
        "Reserved memory",
        "Tensor allocations",
    ]
    bars = {tuple(i for i, ch in enumerate(r) if ch == "|") for r in rows}
    assert len(bars) == 1, "\n".join(rows)
    assert "1023.00 MiB" in rows[1], rows[1]
