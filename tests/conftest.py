import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Slow tests first, in their collected order: with two workers (scripts/test.sh), a long test
    collected last would run alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def _neuron_compile_cache(tmp_path_factory):
    """A private compile cache for the test session (never the user's)."""
    path = tmp_path_factory.mktemp("neff_cache")
    old = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TORCH_NEURONX_NEFF_CACHE_DIR", None)
    else:
        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = old


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and the compile metrics reset around a test."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # "compiled before": what the readiness report asks Dynamo
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # later tests start with nothing compiled before them
