"""Hooks for library paths that do not apply to neuron: DataParallel refused with the way out,
misleading log messages of accelerate / transformers filtered (filters on their own loggers)."""

import logging

import pytest
import torch


class _Records(logging.Handler):
    def __init__(self, name):
        super().__init__(logging.DEBUG)
        self.logger = logging.getLogger(name)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.level = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)
        return self.messages

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


def test_data_parallel_on_neuron_refused_at_construction_naming_ddp():
    model = torch.nn.Linear(4, 3).to("neuron")
    with pytest.raises(RuntimeError, match=r"DataParallel is not supported on neuron.*DistributedDataParallel"):
        torch.nn.DataParallel(model)
    with pytest.raises(RuntimeError, match="DistributedDataParallel"):
        torch.nn.DataParallel(model, device_ids=[0])


def test_module_registration_unaffected_for_other_modules():
    seq = torch.nn.Sequential()
    seq.module = torch.nn.Linear(2, 2)  # same attribute name, not a DataParallel
    assert isinstance(seq.module, torch.nn.Linear)


def test_accelerate_max_memory_on_neuron_cores_is_not_called_unavailable():
    from accelerate.utils import get_max_memory

    n = torch.neuron.device_count()
    assert n >= 2
    with _Records("accelerate.utils.modeling") as messages:
        mm = get_max_memory({0: "1GB", n - 1: "2GB", n + 5: "1GB"})
    assert mm[0] == 10**9 and mm[n - 1] == 2 * 10**9
    assert not any(f"Device {i} is" in m for m in messages for i in (0, n - 1)), messages
    # an index beyond the visible cores is still reported
    assert any(f"Device {n + 5} is not available" in m for m in messages), messages


def test_trainer_compile_does_not_mention_gpu_ampere(tmp_path):
    from transformers import TrainingArguments

    with _Records("transformers.training_args") as messages:
        args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, report_to="none")
    assert args.device.type == "neuron" and args.torch_compile_backend == "neuron"
    assert not any("Ampere" in m for m in messages), messages
