"""Tensor-parallel generation under torchrun: examples/generate.py's loader with
tp_plan="auto" on every process, tokens checked against a single-process run.
Usage: generate_tp_worker.py MODEL_DIR REFERENCE_JSON (written by examples/generate.py --json)"""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the shared helpers

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from helpers import load_example  # noqa: E402


def main():
    path, ref_path = sys.argv[1], sys.argv[2]
    assert "HF_DEACTIVATE_ASYNC_LOAD" not in os.environ
    gen = load_example("generate")
    local_rank = int(os.environ["LOCAL_RANK"])
    model, tok = gen.load(path, "neuron")
    assert dist.is_initialized() and dist.get_backend() == "neuron" and dist.get_world_size() == 2
    w = model.model.layers[0].self_attn.q_proj.weight
    # sharded for real: a DTensor on this process's core holding half of the rows
    assert isinstance(w, DTensor) and w.device_mesh.device_type == "neuron", type(w)
    local = w.to_local()
    assert local.device == torch.device("neuron", local_rank), local.device
    assert local.shape[0] * 2 == w.shape[0], (local.shape, w.shape)
    with open(ref_path) as f:
        ref_run = json.load(f)
    ref, new_tokens, seed = ref_run["tokens"], ref_run["max_new_tokens"], ref_run["seed"]
    args = SimpleNamespace(device="neuron", cpu_equal_rng=ref_run.get("cpu_equal_rng", False))
    for static in (False, True):
        for mode in gen.MODES:
            name = f"{mode}/{'static' if static else 'dynamic'}"
            with gen._rng_mode(args):  # the reference's random stream
                got = gen.generate(model, tok, mode, static, new_tokens, seed)
            assert got == ref[name], (name, got, ref[name])
    m = torch.neuron.get_dynamo_metrics()
    assert m["graphs_compiled"] >= 1 and not m["fallbacks"], m
    print(
        f"rank {dist.get_rank()}: TP=2 generation equals the single process; {m['graphs_compiled']} graph(s)",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
