"""torch.neuron device management and the simulated instance configuration."""

import pytest
import torch

from helpers import run_python


def test_default_instance_is_one_trn2_chip_at_lnc2():
    assert torch.neuron.device_count() == 4
    p = torch.neuron.get_device_properties(0)
    assert p.name == "trn2" and p.total_memory == 24 * 2**30
    assert p.logical_nc_config == 2 and p.physical_cores == (0, 1)
    assert torch.neuron.get_device_name() == "trn2"
    assert torch.accelerator.device_count() == 4


def test_set_device_and_context():
    prev = torch.neuron.current_device()
    try:
        torch.neuron.set_device(1)
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
        with torch.neuron.device(3):
            assert torch.neuron.current_device() == 3
            assert torch.empty(1, device="neuron").device.index == 3
        assert torch.neuron.current_device() == 1
        torch.accelerator.set_device_index(2)
        assert torch.neuron.current_device() == 2 == torch.accelerator.current_device_index()
    finally:
        torch.neuron.set_device(prev)


def test_current_device_is_process_wide_for_threads():
    import threading

    prev = torch.neuron.current_device()
    torch.neuron.set_device(2)
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.empty(1, device="neuron").device.index))
    t.start()
    t.join()
    torch.neuron.set_device(prev)
    assert seen == [2]


def test_device_context_is_thread_local():
    import threading

    prev = torch.neuron.current_device()
    torch.neuron.set_device(1)
    seen = []
    with torch.neuron.device(3):
        t = threading.Thread(target=lambda: seen.append(torch.neuron.current_device()))
        t.start()
        t.join()
        assert torch.neuron.current_device() == 3
    torch.neuron.set_device(prev)
    assert seen == [1]


def test_invalid_device_index():
    with pytest.raises(IndexError, match="Invalid device index neuron:7"):
        torch.empty(1, device="neuron:7")
    with pytest.raises(IndexError):
        torch.neuron.set_device(9)
    with pytest.raises(IndexError):
        torch.neuron.get_device_properties(4)


def test_local_rank_selects_current_device():
    r = run_python(
        "import torch; print(torch.neuron.current_device(), torch.empty(1, device='neuron').device)",
        env={"LOCAL_RANK": "3"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "neuron:3"]


@pytest.mark.parametrize(
    "env, count, chip, memory",
    [
        ({"NEURON_LOGICAL_NC_CONFIG": "1"}, 8, "trn2", 12 * 2**30),
        ({"NEURON_RT_VISIBLE_CORES": "1,3"}, 2, "trn2", 24 * 2**30),
        ({"NEURON_RT_VISIBLE_CORES": "0-2"}, 3, "trn2", 24 * 2**30),
        ({"NEURON_RT_NUM_CORES": "2"}, 2, "trn2", 24 * 2**30),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge"}, 64, "trn2", 24 * 2**30),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"}, 128, "trn2", 12 * 2**30),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn3.3xlarge"}, 4, "trn3", 36 * 2**30),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge"}, 2, "trn1", 16 * 2**30),
    ],
)
def test_instance_configuration(env, count, chip, memory):
    r = run_python(
        "import torch; p = torch.neuron.get_device_properties(0); "
        "print(torch.neuron.device_count(), p.name, p.total_memory)",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(count), chip, str(memory)]


def test_visible_cores_map_to_logical_ids():
    r = run_python(
        "import torch; print([torch.neuron.get_device_properties(i).logical_core_id for i in range(2)])",
        env={"NEURON_RT_VISIBLE_CORES": "1,3"},
    )
    assert r.stdout.strip() == "[1, 3]"


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG"),
        ({"NEURON_LOGICAL_NC_CONFIG": "two"}, "NEURON_LOGICAL_NC_CONFIG"),
        ({"NEURON_RT_VISIBLE_CORES": "0-9"}, "NEURON_RT_VISIBLE_CORES"),
        ({"NEURON_RT_VISIBLE_CORES": "3-1"}, "NEURON_RT_VISIBLE_CORES"),
        ({"NEURON_RT_NUM_CORES": "5"}, "NEURON_RT_NUM_CORES"),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "p5.48xlarge"}, "TORCH_NEURONX_INSTANCE_TYPE"),
        ({"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"}, "NEURON_LOGICAL_NC_CONFIG"),
    ],
)
def test_invalid_configuration_names_the_variable(env, variable):
    r = run_python(
        "import torch\n"
        "assert not torch.neuron.is_available()\n"
        "try:\n"
        "    torch.empty(1, device='neuron')\n"
        "except ValueError as e:\n"
        "    print(e)\n",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert variable in r.stdout


def test_init_and_is_initialized():
    r = run_python(
        "import torch; a = torch.neuron.is_initialized(); torch.manual_seed(0); b = torch.neuron.is_initialized();"
        " torch.ones(1, device='neuron'); print(a, b, torch.neuron.is_initialized())"
    )
    assert r.stdout.split() == ["False", "False", "True"]


@pytest.mark.parametrize("choose", ["torch.neuron.set_device", "torch.accelerator.set_device_index"])
def test_choosing_a_device_initialises_as_on_cuda(choose):
    # DeviceMesh binds a rank to a device only while the device is uninitialised, and a
    # device-less "neuron" means the current device only once it is initialised.
    r = run_python(
        f"import torch; a = torch.neuron.is_initialized(); {choose}(2);"
        " print(a, torch.neuron.is_initialized(), torch.neuron.current_device())"
    )
    assert r.stdout.split() == ["False", "True", "2"], r.stderr
    # a bad index is refused before anything is initialised
    r = run_python(
        f"import torch\ntry:\n    {choose}(99)\nexcept IndexError as e:\n"
        "    print(type(e).__name__, torch.neuron.is_initialized())"
    )
    assert r.stdout.split() == ["IndexError", "False"], r.stdout + r.stderr


def test_misc_properties():
    assert torch.neuron.is_bf16_supported()
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()
    torch.neuron.synchronize()
    torch.accelerator.synchronize()
