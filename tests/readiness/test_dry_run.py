"""The dry run: real size, no data, real allocator accounting, values it cannot know."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_neuronx
from torch_neuronx.readiness import ValueUnknownError
from torch_neuronx.readiness.report.render import UNFUSED

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(dtype=torch.float32, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to("neuron")
    model.to(dtype)  # a fake model's .to(dtype) swaps its parameters: must work
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(64, 256, device="neuron", dtype=dtype)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        x.double().std()  # float64: a fallback in both runs
    return model


def _report(dry: bool, train=None):
    torch.neuron.empty_cache()  # the other run's cached blocks would count as reserved
    with torch_neuronx.readiness(dry_run=dry) as r:
        _train(**(train or {}))
    return r


def test_dry_run_equals_real_run_in_memory_ops_and_fallbacks():
    real = _report(False)
    dry = _report(True)
    (mr,), (md,) = real.report.data["memory"], dry.report.data["memory"]
    assert abs(md["peak_allocated"] - mr["peak_allocated"]) <= 0.05 * mr["peak_allocated"]
    assert md["peak_reserved"] == pytest.approx(mr["peak_reserved"], rel=0.1)  # the cache: freed in another order
    rec_r, rec_d = real.recording, dry.recording
    assert rec_d.buckets[1].ops == rec_r.buckets[1].ops
    strip = lambda fs: sorted((f.op, f.dtype, f.reason, f.count) for f in fs)  # noqa: E731
    assert strip(rec_d.fallbacks) == strip(rec_r.fallbacks) != []
    assert dry.report.summary().startswith("torch-neuronx readiness (dry run):")
    assert not rec_r.dry_run and rec_d.dry_run
    assert UNFUSED not in dry.report.to_markdown()  # nothing compiled: no graph's intermediates to count


def test_an_optimizer_made_before_the_model_moves_steps_the_device_parameters():
    """Accelerate's order: the optimizer is made on the host model, then prepare() moves the model.
    On the device the Parameter objects stay (their data is swapped in); a dry run's must act so."""

    def run(dry):
        torch.neuron.empty_cache()
        with torch_neuronx.readiness(dry_run=dry) as r:
            model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model.to("neuron")
            for _ in range(2):
                model(torch.randn(64, 256, device="neuron")).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            states = len(opt.state)
        return r.report.data["memory"][0], states

    (real, real_states), (dry, dry_states) = run(False), run(True)
    assert dry_states == real_states == 4
    assert dry["breakdown"]["optimizer state"] == 2 * 4 * (256 * 1024 + 1024 + 1024 * 256 + 256)
    assert abs(dry["peak_allocated"] - real["peak_allocated"]) <= 0.01 * real["peak_allocated"]


def test_setting_data_moves_a_host_tensor_in_place_as_on_the_device():
    """FSDP2's fully_shard moves a host-built model with ``param.data = param.to(device)``: each
    Parameter object stays, on the device, with what it had (an optimizer made before holds it)."""

    def run(dry):
        torch.neuron.empty_cache()
        with torch_neuronx.readiness(dry_run=dry) as r:
            model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.BatchNorm1d(1024))
            model[0].bias.requires_grad_(False)
            model[0].weight.tag = "kept"  # a library's attribute on the parameter
            params = list(model.parameters())
            opt = torch.optim.AdamW(params, lr=1e-3)
            for t in (*params, *model.buffers()):
                t.data = t.to("neuron")
            assert list(model.parameters()) == params and model[0].weight.tag == "kept"
            assert all(isinstance(p, torch.nn.Parameter) and p.device.type == "neuron" for p in params)
            assert [p.requires_grad for p in params] == [True, False, True, True]
            assert all(b.device.type == "neuron" for b in model.buffers())
            for _ in range(2):
                model(torch.randn(64, 256, device="neuron")).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            states = len(opt.state)
            assert int(model[1].num_batches_tracked) == 2  # a moved buffer keeps its known value
        return r.report.data["memory"][0], states

    (real, real_states), (dry, dry_states) = run(False), run(True)
    assert dry_states == real_states == 3
    assert abs(dry["peak_allocated"] - real["peak_allocated"]) <= 0.01 * real["peak_allocated"], (dry, real)
    assert "data" not in vars(torch.Tensor)  # the dry run's setter is gone after it


def test_a_parameter_made_from_known_host_values_moves_with_its_module():
    """A small weight made on the host and moved over has known values; wrapped in a Parameter,
    it must still be swappable when the module moves (diffusers' tensor-parallel loader does this
    with the replicated norms and biases of a Flux transformer)."""
    with torch_neuronx.readiness(dry_run=True) as r:
        m = torch.nn.Linear(4, 4, device="neuron")
        # as accelerate's loader sets it: into _parameters, no registration hook
        m._parameters["bias"] = torch.nn.Parameter(torch.zeros(4).to("neuron"))
        m.to("neuron", torch.bfloat16)  # Module.to swaps fake parameters
    assert m.bias.dtype == torch.bfloat16 and r.report.verdict == "runs natively"


def test_a_fake_tensor_deep_copies_in_the_same_mode():
    """accelerate's FSDP2 preparation deep-copies the model's non-persistent buffers."""
    import copy

    with torch_neuronx.readiness(dry_run=True):
        buffers = {"inv_freq": torch.arange(64, dtype=torch.float32).to("neuron"), "big": torch.empty(1 << 24)}
        copied = copy.deepcopy(buffers)
        assert copied["big"] is not buffers["big"] and copied["big"].shape == (1 << 24,)
        assert copied["inv_freq"].device == torch.device("neuron", 0)
        assert (copied["big"] + buffers["big"]).shape == (1 << 24,)  # the same mode: they combine


def test_a_dtensor_value_read_gets_a_placeholder():
    """The Trainer logs FSDP2's gradient norm, a DTensor, with item()."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    with torch_neuronx.readiness(dry_run=True, rank=0, world_size=2) as r:
        dist.init_process_group("neuron")
        mesh = init_device_mesh("neuron", (2,))
        norm = distribute_tensor(torch.ones(4, device="neuron"), mesh, [Replicate()]).norm()
        assert norm.item() == 1.0
    reads = r.report.data["dry_run"]["value_reads"]
    assert [(v["kind"], v["placeholder"]) for v in reads] == [("float", 1.0)]


def _held_by_earlier_tests() -> int:
    """What earlier tests in this worker still hold, their garbage collected first: reference cycles
    (Dynamo's caches make some) collected during a test would leave its counts and peaks."""
    gc.collect()
    return torch.neuron.memory_allocated()


def test_compiled_graphs_are_dynamos_own():
    def run(dry):
        torch._dynamo.reset()
        torch.neuron.empty_cache()
        before = _held_by_earlier_tests()
        with torch_neuronx.readiness(dry_run=dry) as r:
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
            compiled = torch.compile(model.to("neuron"), backend="neuron")
            for batch in (8, 8, 4):  # the last batch recompiles
                compiled(torch.randn(batch, 64, device="neuron")).sum().backward()
        r.report.data["own_peak"] = r.report.data["memory"][0]["peak_allocated"] - before
        r.report.data["markdown"] = r.report.to_markdown()
        return r.report.data

    real, dry = run(False), run(True)
    for key in ("graphs", "recompilations"):
        assert len(dry["compile"][key]) == len(real["compile"][key]) > 0
    # A graph's ops run one by one on fake tensors: its intermediates all count (an upper
    # bound: the real compiled kernel keeps some on chip); what the backward keeps is the same.
    assert real["own_peak"] <= dry["own_peak"]
    assert UNFUSED in dry["markdown"]  # the report says so, among what a dry run cannot know


def test_breakdown_counts_parameters_gradients_and_optimizer_state_exactly():
    r = _report(True, train={"dtype": torch.bfloat16})
    n_params = 256 * 1024 + 1024 + 1024 * 256 + 256
    (m,) = r.report.data["memory"]
    b = m["breakdown"]
    assert b["parameters"] == n_params * 2
    assert b["gradients"] == n_params * 2
    assert b["optimizer state"] == 2 * n_params * 2  # AdamW's exp_avg and exp_avg_sq (its steps are host tensors)
    assert sum(b.values()) == m["top_tensors_at"]
    assert {t["kind"] for t in m["top_tensors"]} >= {"parameters", "gradients"}


def test_no_host_memory_behind_a_model_larger_than_this_machine():
    before = _held_by_earlier_tests()
    with torch_neuronx.readiness(dry_run=True) as r:
        w = torch.empty(40 << 30, dtype=torch.uint8)  # 40 GiB on the host: fake, nothing allocated
        big = torch.empty(20 << 30, dtype=torch.uint8, device="neuron")
        assert torch.neuron.memory_allocated() == before + (20 << 30)  # the core's accounting is real
        del big
        assert torch.neuron.memory_allocated() == before
        assert w.shape == (40 << 30,)
    assert r.report.data["memory"][0]["peak_allocated"] == before + (20 << 30)


def test_out_of_memory_where_the_device_raises_it():
    before = _held_by_earlier_tests()
    with pytest.raises(torch.OutOfMemoryError, match="Neuron out of memory"):
        with torch_neuronx.readiness(dry_run=True):
            keep = [torch.empty(10 << 30, dtype=torch.uint8, device="neuron") for _ in range(3)]  # 30 of 24 GiB
            del keep
    assert torch.neuron.memory_allocated() - before < 1 << 20  # what the dry run reserved is released


def test_after_out_of_memory_larger_cores_are_not_said_to_fit():
    """The run stopped at the allocation that failed: its peak says nothing of larger cores."""
    with pytest.raises(torch.OutOfMemoryError):
        with torch_neuronx.readiness(dry_run=True, instance="trn2.48xlarge") as r:
            keep = [torch.empty(10 << 30, dtype=torch.uint8, device="neuron") for _ in range(3)]  # 30 of 24 GiB
            del keep
    fit = {(f["chip"], f["lnc"]): f["fits"] for f in r.report.data["fit"]}
    assert fit[("trn2", 2)] == "no (ran out of memory)"
    assert fit[("trn3", 2)] == "unknown (ran out of memory at 24.00 GiB, so it needs more than that)"


def test_value_reads_get_placeholders_and_are_listed_with_their_line():
    with torch_neuronx.readiness(dry_run=True) as r:
        loss = torch.randn(8, device="neuron").pow(2).mean()
        value = loss.item()
        finite = not (torch.isnan(loss) or torch.isinf(loss))  # the Trainer's check: assumed finite
        counts = torch.tensor([3, 4, 5]).sum().item()  # a small host tensor keeps its value
    assert value == 1.0 and finite and counts == 12
    reads = r.report.data["dry_run"]["value_reads"]
    assert [(v["kind"], v["placeholder"]) for v in reads] == [("float", 1.0)]
    assert reads[0]["site"].startswith(f"{__file__}:")
    assert r.report.data["dry_run"]["assumed"][0]["check"] == "finite"


def test_branch_on_a_value_stops_at_its_line():
    with pytest.raises(ValueUnknownError, match=r"control flow at .*test_dry_run.py:\d+"):
        with torch_neuronx.readiness(dry_run=True):
            loss = torch.randn(8, device="neuron").pow(2).mean()
            if loss < 0.5:
                pass


def test_value_dependent_shape_stops_at_its_line():
    with pytest.raises(ValueUnknownError, match=r"aten::nonzero at .*test_dry_run.py:\d+"):
        with torch_neuronx.readiness(dry_run=True):
            torch.nonzero(torch.randn(8, device="neuron") > 0)


def test_header_only_checkpoint_loads_without_data(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000
    )
    total = torch_neuronx.readiness.header_only_checkpoint(config, str(tmp_path))
    files = [p for p in tmp_path.iterdir() if p.suffix == ".safetensors"]
    assert sum(os.stat(p).st_blocks * 512 for p in files) < total / 10  # a hole, not data
    with torch_neuronx.readiness(dry_run=True) as r:
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16).to("neuron")
        n = sum(p.numel() for p in model.parameters())
    assert n * 2 == total
    assert r.report.data["memory"][0]["peak_allocated"] >= total


def _config_only_dir(path):
    """A model directory with config.json (and a tokenizer file) and no weights; its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=1000,
        dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    config.save_pretrained(path)
    (path / "tokenizer_config.json").write_text("{}")
    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(config).parameters())


def test_stand_ins_replace_only_config_only_directories(tmp_path):
    from torch_neuronx.readiness.dry.checkpoints import stand_ins as _stand_ins

    cfg, weights = tmp_path / "cfg", tmp_path / "weights"
    _config_only_dir(cfg)
    _config_only_dir(weights)
    (weights / "model.safetensors").write_bytes(b"")
    cmd = ["python", "train.py", str(cfg), f"--model_name_or_path={cfg}", "--other", str(weights), "--x=1"]
    out, absent = _stand_ins(cmd, str(tmp_path / "stand-ins"))
    stand_in = str(tmp_path / "stand-ins" / "weights-0")
    assert out == ["python", "train.py", stand_in, f"--model_name_or_path={stand_in}", "--other", str(weights), "--x=1"]
    assert [(a["path"], a["class"], a["dtype"], a["dtype_from_config"]) for a in absent] == [
        (str(cfg), "LlamaForCausalLM", "bfloat16", True)
    ]
    assert sorted(os.listdir(cfg)) == ["config.json", "tokenizer_config.json"]  # the user's directory is untouched
    assert os.path.realpath(os.path.join(stand_in, "tokenizer_config.json")) == str(cfg / "tokenizer_config.json")


def test_in_process_a_directory_without_weights_gets_transformers_error_and_the_way_out(tmp_path):
    from transformers import AutoModelForCausalLM

    _config_only_dir(tmp_path)
    with pytest.raises(OSError, match="no file named") as info:
        with torch_neuronx.readiness(dry_run=True) as r:
            AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert any("header_only_checkpoint" in n and "check --dry-run" in n for n in info.value.__notes__)
    assert "header_only_checkpoint" in r.report.data["errors"][0]


@pytest.mark.slow
def test_check_dry_run_loads_a_directory_without_weights(tmp_path, capsys):
    from torch_neuronx.readiness.launch import cli as _cli

    n = _config_only_dir(tmp_path / "model")
    script = tmp_path / "load.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).to("neuron")
            model(torch.ones(1, 16, dtype=torch.long, device="neuron"))
            """
        )
    )
    out = tmp_path / "rep"
    job = ["--", sys.executable, str(script), str(tmp_path / "model")]
    assert _cli.main(["--dry-run", "--out", str(out)] + job) == 0
    rep = json.loads((out / "report.json").read_text())
    (absent,) = rep["dry_run"]["absent_weights"]
    assert absent["path"] == str(tmp_path / "model") and absent["bytes"] == 2 * n
    assert rep["memory"][0]["peak_allocated"] >= 2 * n
    assert "weights absent   " in capsys.readouterr().out
    assert "Weights absent" in (out / "report.md").read_text()
    # A real run needs the weights: transformers' own error, as without the simulator.
    assert _cli.main(["--out", str(tmp_path / "real")] + job) != 0


WORKER = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    class MLP(torch.nn.Module):
        def __init__(s):
            super().__init__(); s.up = torch.nn.Linear(256, 1024); s.down = torch.nn.Linear(1024, 256)
        def forward(s, x): return s.down(torch.relu(s.up(x)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[MLP() for _ in range(3)]).to("neuron")
    for m in model:
        parallelize_module(m, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(m, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        loss = model(torch.randn(8, 256, device="neuron")).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_job_dry_run_has_every_rank_and_the_real_collectives(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(WORKER)
    reports = {}
    for mode in ("real", "dry"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out)]
        cmd += ["--dry-run"] if mode == "dry" else []
        cmd += ["--", "torchrun", "--standalone", "--nproc-per-node", "4", str(script)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        reports[mode] = json.loads((out / "report.json").read_text())
    real, dry = reports["real"], reports["dry"]
    assert sorted(r["rank"] for r in dry["memory_per_rank"]) == [0, 1, 2, 3]
    assert dry["memory"][0]["label"] == "ranks 0-3"  # identical ranks: one class
    # the same peak on every rank: FSDP2's storage resizes, DTensor ops on local shards and the
    # optimizer state of sharded parameters are all accounted
    peaks = lambda r: sorted((m["rank"], m["peak_allocated"]) for m in r["memory_per_rank"])  # noqa: E731
    for (rank, d), (_, r) in zip(peaks(dry), peaks(real)):
        assert abs(d - r) <= 0.01 * r, (rank, d, r)
    key = lambda cs: sorted((c["kind"], c["dtype"], c["bytes"], c["group_size"]) for c in cs)  # noqa: E731
    assert key(dry["collectives"]) == key(real["collectives"]) != []
    assert dry["fallbacks"] == real["fallbacks"]
    # TP x FSDP2 subgroups: the ranks' collectives agree in every group, in both runs
    assert dry["across_ranks"]["findings"] == real["across_ranks"]["findings"] == []
    assert len(dry["across_ranks"]["groups"]) >= 3  # the default group and the mesh's two dimensions
    assert dry["dry_run"] is not None and real["dry_run"] is None


def test_in_process_dry_run_as_one_rank_of_a_larger_job():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    with torch_neuronx.readiness(dry_run=True, rank=5, world_size=8) as r:
        dist.init_process_group("neuron")
        mesh = init_device_mesh("neuron", (4, 2), mesh_dim_names=("dp", "tp"))
        seen = (dist.get_rank(), dist.get_world_size(), mesh.get_coordinate())
        x = torch.randn(64, 64, device="neuron")
        dist.all_reduce(x, group=mesh["dp"].get_group())
    assert seen == (5, 8, (2, 1))
    assert not dist.is_initialized()  # the block's fake process group does not outlive it
    d = r.report.data
    assert (d["world_size"], d["ranks_run"], d["ranks_not_run"]) == (8, [5], [0, 1, 2, 3, 4, 6, 7])
    assert [m["rank"] for m in d["memory_per_rank"]] == [5]
    assert "ranks 0-4, 6-7 of the job's 8 were not run" in r.report.summary()
    assert d["verdict"].endswith("(on rank 5 (1 of 8 ranks run); the others unknown)")
    with pytest.raises(ValueError, match="need dry_run=True"):
        torch_neuronx.readiness(rank=1, world_size=2)


def test_a_wait_returns_its_collectives_buffer_counted_once():
    """On the device a wait returns the tensor its collective wrote; the fake mode makes a new one.
    A caller that keeps both (ring attention's all-to-all rotater keeps the collective's result and
    reads the wait's) holds one buffer, until the last of the two dies."""
    import torch.distributed as dist

    functional = torch.ops._c10d_functional
    with torch_neuronx.readiness(dry_run=True, rank=0, world_size=2):
        dist.init_process_group("neuron")
        x = torch.empty(1 << 20, device="neuron")  # 4 MiB; gathered from 2 ranks: 8 MiB
        base = torch.neuron.memory_allocated()
        gathered = functional.all_gather_into_tensor(x, 2, dist.group.WORLD.group_name)
        waited = functional.wait_tensor(gathered)
        held = [torch.neuron.memory_allocated() - base]
        del gathered
        held.append(torch.neuron.memory_allocated() - base)
        doubled = waited * 2  # an op on the wait's result is device work: its output is reserved
        held.append(torch.neuron.memory_allocated() - base)
        del waited, doubled
        held.append(torch.neuron.memory_allocated() - base)
    assert held == [8 << 20, 8 << 20, 16 << 20, 0]


def test_threads_the_script_starts_run_dry_too():
    # Dispatch modes are per thread; a loader thread's ops must not allocate for real.
    import threading

    from torch._subclasses.fake_tensor import FakeTensor

    before = _held_by_earlier_tests()
    seen = {}

    def work():
        x = torch.empty(1 << 30, device="neuron")  # 4 GiB: only its accounting exists
        seen["fake"], seen["allocated"] = isinstance(x, FakeTensor), torch.neuron.memory_allocated()

    with torch_neuronx.readiness(dry_run=True):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert seen == {"fake": True, "allocated": before + (1 << 32)}
    assert torch.neuron.memory_allocated() == before


def test_a_thread_that_outlives_the_dry_run_runs_for_real_after_it():
    from concurrent.futures import ThreadPoolExecutor

    from torch._subclasses.fake_tensor import FakeTensor

    pool = ThreadPoolExecutor(max_workers=1)  # its worker starts at the first submit
    try:
        with torch_neuronx.readiness(dry_run=True):
            assert isinstance(pool.submit(torch.ones, 2, device="neuron").result(), FakeTensor)
        after = pool.submit(lambda: torch.ones(2, device="neuron") + 1).result()
        assert not isinstance(after, FakeTensor) and after.cpu().tolist() == [2.0, 2.0]
    finally:
        pool.shutdown()


def test_a_thread_joined_by_an_exit_hook_ends_without_aborting_the_process():
    # tqdm's monitor thread, started by a progress bar during a dry run, is joined by tqdm's
    # exit hook. A thread that ended with the dry run's modes on its dispatch stack released
    # them in a thread-local destructor that took the GIL as Python finalised: SIGABRT in
    # nearly every run of this script. Registered first, this hook runs last.
    p = _run_apart(
        """
        import atexit, threading
        stop, threads = threading.Event(), []
        atexit.register(lambda: (stop.set(), [t.join() for t in threads]))
        import torch, torch_neuronx

        with torch_neuronx.readiness(dry_run=True):
            threads.append(threading.Thread(target=stop.wait, daemon=True))
            threads[0].start()
            torch.ones(2, device="neuron")
        """
    )
    assert p.returncode == 0, p.stderr[-2000:]


def test_dtensor_caches_its_sharding_propagation_as_in_eager():
    # The dry run's fake mode would make DTensor think it is tracing and skip its cache.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    prop = DTensor._op_dispatcher.sharding_propagator
    with torch_neuronx.readiness(dry_run=True, rank=0, world_size=4):
        dist.init_process_group("neuron")
        mesh = init_device_mesh("neuron", (4,))
        w = distribute_tensor(torch.randn(68, 52, device="neuron"), mesh, [Shard(0)])  # shapes no other test uses
        misses = prop.propagate_op_sharding.cache_info().misses
        for _ in range(3):
            y = (w * 2).sum()
        # mul and sum propagate once, through the cache; the repeats reuse the result
        assert prop.propagate_op_sharding.cache_info().misses == misses + 2
        assert y.shape == ()
    assert "propagate_op_sharding_non_cached" not in vars(prop)  # removed with the dry run


def test_ranks_option_is_checked_against_the_job(tmp_path, capsys):
    from torch_neuronx.readiness.launch import cli as _cli

    job = ["--", "torchrun", "--nproc-per-node", "8", str(tmp_path / "job.py")]
    assert _cli.main(["--dry-run", "--ranks", "0,8", "--out", str(tmp_path / "r")] + job) == 2
    assert "rank 8 is not in the job: its world size is 8" in capsys.readouterr().err
    assert _cli.main(["--ranks", "0", "--out", str(tmp_path / "r")] + job) == 2
    assert "--ranks needs --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli.main(["--dry-run", "--ranks", "3-1"] + job)
    assert "empty range" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_dry_run_of_some_ranks_of_a_torchrun_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        WORKER.replace("for step in range(3)", "print('coord', mesh.get_coordinate())\nfor step in range(3)")
    )
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", "trn2.48xlarge"]
    cmd += ["--ranks", "0,5", "--out", str(out)]
    cmd += ["--", "torchrun", "--standalone", "--nproc-per-node", "8", str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    rep = json.loads((out / "report.json").read_text())
    assert (rep["world_size"], rep["ranks_run"]) == (8, [0, 5])
    assert rep["ranks_not_run"] == [1, 2, 3, 4, 6, 7]
    assert sorted(m["rank"] for m in rep["memory_per_rank"]) == [0, 5]  # only what ran
    assert "ranks 1-4, 6-7 of the job's 8 were not run" in (out / "report.md").read_text()
    assert "dry run of ranks 0, 5 of 8" in p.stdout and "coord (0, 0)" in p.stdout


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ranks_start_one_at_a_time_until_each_has_loaded(tmp_path):
    # Loading is when a rank holds the most host memory (a tensor-parallel load reads its
    # slices), so a rank starts only once the one before it has begun its first forward.
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time, torch
            log = open(os.path.join(os.path.dirname(__file__), "times.txt"), "a")
            rank = int(os.environ["RANK"])
            log.write(f"{rank} start {time.time()}\\n"); log.flush()
            model = torch.nn.Linear(4, 4).to("neuron")
            time.sleep(1.0)  # "loading"
            log.write(f"{rank} forward {time.time()}\\n"); log.flush()
            model(torch.ones(4, device="neuron")).sum().backward()
            """
        )
    )
    from torch_neuronx.readiness.launch.job import Job, RankSpec

    every = RankSpec(None, classes=False)
    job = Job(str(tmp_path / "raw"), [str(script)], dry_run=True, nproc_per_node=3, workers=3, ranks=every)
    cmd = [sys.executable, "-m", "torch_neuronx.readiness.launch.scheduler", "--job", job.save()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    times = {}
    for line in (tmp_path / "times.txt").read_text().splitlines():
        rank, what, t = line.split()
        times[(int(rank), what)] = float(t)
    for rank in (0, 1):
        assert times[(rank + 1, "start")] >= times[(rank, "forward")], times
    ranks = ["rank0.json", "rank1.json", "rank1.log", "rank2.json", "rank2.log"]
    assert sorted(f for f in os.listdir(tmp_path / "raw") if not f.startswith("groups")) == ["job.json"] + ranks


def _run_apart(code: str) -> subprocess.CompletedProcess:
    """`code` in a Python of its own: what these tests check crashed the process before."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def test_dtensor_random_init_of_sharded_parameters():
    # How torchtitan initialises its FSDP2 (and FSDP2 x TP) parameters: DTensor's RNG tracker takes
    # the generator's state to the device and back (fake in a dry run), trunc_normal_ branches on
    # a replicated DTensor's value, and a strided shard's offsets come from a host arange.
    p = _run_apart(
        """
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.placement_types import _StridedShard
        import torch_neuronx

        with torch_neuronx.readiness(dry_run=True, rank=3, world_size=4) as r:
            dist.init_process_group("neuron")
            mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
            before = torch.neuron.get_rng_state()
            w = distribute_tensor(torch.empty(64, 32, device="neuron"), mesh, [Shard(0), Replicate()])
            torch.nn.init.normal_(w, std=0.02)
            print("sharded", tuple(w.to_local().shape), torch.equal(torch.neuron.get_rng_state(), before))
            q = w.new_empty(32, 32)  # replicated
            torch.nn.init.trunc_normal_(q, std=0.02)
            print("replicated", q.placements)
            s = distribute_tensor(torch.empty(64, 32, device="neuron"), mesh, [_StridedShard(0, split_factor=2), Shard(0)])
            torch.nn.init.normal_(s)
            print("strided", tuple(s.to_local().shape))
        print(r.report.data["verdict"])
        """
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "sharded (32, 32) True" in p.stdout  # the fake state did not touch the generator
    assert "replicated (Replicate(), Replicate())" in p.stdout
    assert "strided (16, 32)" in p.stdout
    assert "runs natively" in p.stdout


def test_plain_torch_compile_generates_no_code_in_a_dry_run():
    # backend "inductor" (torch.compile's default, which torchtitan uses for FlexAttention and its
    # block masks) reaches Inductor without backend "neuron": generated code would read fake memory.
    p = _run_apart(
        """
        import torch
        import torch_neuronx

        f = lambda x: (x * 2).sin().sum(0)
        with torch_neuronx.readiness(dry_run=True) as r:
            y = torch.compile(f)(torch.randn(1 << 20, 64, device="neuron"))
            print("dry", type(y).__name__, tuple(y.shape))
        graphs = r.report.data["compile"]["graphs"]
        print("graphs", len(graphs), graphs[0]["cache"])
        torch._dynamo.reset()
        x = torch.randn(8, 4, device="neuron")
        print("real", torch.allclose(torch.compile(f)(x).cpu(), f(x.cpu())))
        """
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "dry FakeTensor (64,)" in p.stdout
    assert "graphs 1 dry run" in p.stdout
    assert "real True" in p.stdout  # after the dry run, Inductor compiles again


def test_small_host_random_ops_draw_once_as_in_a_real_run():
    # Small host work runs for real in a dry run (the fake mode runs it so too): never twice.
    def draw():
        torch.manual_seed(0)
        return torch.randn(4), torch.randn(4), torch.randint(0, 100, (3,))

    real = draw()
    with torch_neuronx.readiness(dry_run=True):
        dry = draw()
    for d, r in zip(dry, real):
        assert type(d) is torch.Tensor and torch.equal(d, r)


def test_dtensor_ops_are_recorded_on_their_local_shards():
    # Tensor parallelism's matmuls run on DTensors: what this rank's core computes is the local mm.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    with torch_neuronx.readiness(dry_run=True, rank=1, world_size=4) as r:
        dist.init_process_group("neuron")
        mesh = init_device_mesh("neuron", (4,))
        w = distribute_tensor(torch.randn(512, 128, device="neuron", dtype=torch.bfloat16), mesh, [Shard(0)])
        x = distribute_tensor(torch.randn(64, 128, device="neuron", dtype=torch.bfloat16), mesh, [Replicate()])
        y = torch.mm(x, w.t())  # colwise: each rank's 128 of the 512 output features
    assert y.placements == (Shard(1),)
    mms = [(k, n) for b in r.recording.buckets for k, n in b.ops.items() if k.op == "aten::mm"]
    assert [(k.dtype, k.flops, n) for k, n in mms] == [("bfloat16", 2 * 64 * 128 * 128, 1)]
    (est,) = [e for e in r.report.data["estimates"] if e["target"]]
    assert est["tensor_flops"]["bfloat16"] == 2 * 64 * 128 * 128


def test_a_dtensor_op_that_redistributes_first_is_recorded_on_the_redistributed_shards():
    # DTensor all-gathers an input before the local matmul when its strategy needs it: the core
    # multiplies the gathered tensor, not the shard the input had before
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with torch_neuronx.readiness(dry_run=True, rank=0, world_size=2) as r:
        dist.init_process_group("neuron")
        mesh = init_device_mesh("neuron", (2,))
        x = distribute_tensor(torch.randn(96, 160, device="neuron", dtype=torch.bfloat16), mesh, [Shard(0)])
        w = distribute_tensor(torch.randn(160, 224, device="neuron", dtype=torch.bfloat16), mesh, [Shard(1)])
        v = distribute_tensor(torch.randn(160, 64, device="neuron", dtype=torch.bfloat16), mesh, [Shard(0)])
        y = torch.mm(x, w)  # x's rows are all-gathered: (96, 160) @ (160, 112) on each rank
        z = torch.mm(x, v)  # v's rows are all-gathered: (48, 160) @ (160, 64); its shard has 80 rows
    assert (y.placements, tuple(y.to_local().shape)) == ((Shard(1),), (96, 112))
    assert (z.placements, tuple(z.to_local().shape)) == ((Shard(0),), (48, 64))
    mms = sorted(
        (k.flops, k.bytes, k.matmuls) for b in r.recording.buckets for k, n in b.ops.items() if k.op == "aten::mm"
    )
    assert mms == [
        (2 * 48 * 160 * 64, (48 * 160 + 160 * 64 + 48 * 64) * 2, ((48, 160, 64, 1),)),
        (2 * 96 * 160 * 112, (96 * 160 + 160 * 112 + 96 * 112) * 2, ((96, 160, 112, 1),)),
    ]
    assert r.recording.recorder_errors == {}


@pytest.mark.slow  # two Inductor compiles of a small graph: ~15 s
def test_a_compiled_graph_costs_the_same_in_a_dry_run_and_a_real_one(tmp_path, monkeypatch):
    # A static KV cache's update and attention: Inductor's graph passes rewrite the graph before
    # lowering it (the real run's parts), and a dry run must cost the graph they leave. A real run
    # whose graph Inductor's cache already holds skips those passes, and must cost it alike.
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    p = _run_apart(
        """
        import torch
        import torch_neuronx

        def attend(cache, pos, k, q):
            cache.index_copy_(2, pos, k)
            return torch.softmax((q @ cache.transpose(-1, -2)).float() * 0.5, -1)

        def run(dry):
            torch._dynamo.reset()
            args = (torch.zeros(2, 2, 16, 8), torch.tensor([3]), torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8))
            with torch_neuronx.readiness(dry_run=dry) as r:
                torch.compile(attend, backend="neuron")(*(a.to("neuron") for a in args))
            (graph,) = r.report.data["compile"]["graphs"]
            (parts,) = r.recording.graph_parts.values()
            print(graph["cache"], [tuple(p) for p in parts])

        run(False)
        run(True)
        run(False)
        """
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    lines = p.stdout.splitlines()[-3:]
    assert [line.split(" [")[0] for line in lines] == ["miss", "dry run", "hit"], lines
    assert len({line.split(" [", 1)[1] for line in lines}) == 1, lines


def test_a_tied_weight_built_on_the_host_stays_tied_when_the_module_moves():
    """An embedding tied to the LM head, built on the host and moved with ``.to("neuron")``, is
    one parameter on the device in a real run; a dry run must not make two of it."""

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    def run(dry):
        torch.neuron.empty_cache()
        with torch_neuronx.readiness(dry_run=dry) as r:
            m = Tied()
            weight = m.emb.weight
            m.to("neuron")
            assert m.head.weight is m.emb.weight is weight and weight.device.type == "neuron"
            m(torch.zeros(4, 8, dtype=torch.long, device="neuron")).sum().backward()
            assert len(list(m.parameters())) == 1
        return r.report.data["memory"][0]["peak_allocated"]

    real, dry = run(False), run(True)
    assert abs(dry - real) <= 0.01 * real, (dry, real)
    assert torch.nn.Module._apply.__module__ == "torch.nn.modules.module"  # the tap is gone after it


def test_a_causal_lm_reads_its_known_position_ids_but_takes_a_traces_path_for_a_fake_tensor():
    """Position ids made on the device with ``arange`` are known values in a dry run, as a device
    factory's small result of Python values is. transformers still takes a compiler trace's path
    for any fake tensor (``is_tracing``), which reads no values: it builds the causal mask and
    repeats the grouped key/value heads for attention, where a real run, having read that each
    row's positions are one sequence, uses the kernel's causal flag. The dry run's forward keeps
    more than the real run's, never less (transformers is not patched)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )

    def run(dry):
        torch.manual_seed(0)
        with torch_neuronx.readiness(dry_run=dry):
            model = LlamaForCausalLM(config).to("neuron")
            ids = (torch.arange(32) % 128).repeat(2, 1).to("neuron")
            before = torch.neuron.memory_allocated()
            logits = model(input_ids=ids, use_cache=False).logits  # holds what its backward needs
            kept = torch.neuron.memory_allocated() - before
            positions = torch.arange(4, device="neuron").cpu().tolist()
        del logits
        return kept, positions

    (real, real_positions), (dry, dry_positions) = run(False), run(True)
    assert dry_positions == real_positions == [0, 1, 2, 3]
    assert real < dry <= 1.1 * real, (dry, real)
