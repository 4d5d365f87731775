"""`torch-neuronx check` with the launchers users start jobs with: accelerate launch (DDP, the FSDP2 plugin
from a config file), trl's CLI (an accelerate launch of trl's own script), a console script's entry
point, and the commands it cannot run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "accelerate_train.py"
FSDP2 = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 2
num_machines: 1
mixed_precision: bf16
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 1000
  fsdp_reshard_after_forward: true
  fsdp_cpu_ram_efficient_loading: true
"""


def _check(out: Path, dry: bool, *cmd: str, path: tuple = ()) -> subprocess.CompletedProcess:
    """`cmd` under check; `path`: directories the job imports from (PYTHONPATH)."""
    argv = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out)] + (["--dry-run"] if dry else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, path), env.get("PYTHONPATH")]))
    return subprocess.run(argv + ["--", *cmd], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def _report(tmp_path: Path, mode: str, *cmd: str, path: tuple = ()) -> dict:
    out = tmp_path / mode
    p = _check(out, mode.startswith("dry"), *cmd, path=path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


def _collectives(report: dict) -> list:
    return sorted(
        (c["kind"], c["dtype"], c["bytes"], c["group_size"], c["calls_per_step"]) for c in report["collectives"]
    )


def test_accelerate_launch_becomes_the_torchrun_job_and_environment_accelerate_would_start(tmp_path):
    from torch_neuronx.readiness.launch.launchers import translate

    config = tmp_path / "fsdp2.yaml"
    config.write_text(FSDP2)
    cmd, env = translate(["accelerate", "launch", "--config_file", str(config), "train.py", "--lr", "1"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"] and cmd[-3:] == ["train.py", "--lr", "1"]
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["FSDP_MIN_NUM_PARAMS"] == "1000"
    # one process: accelerate's simple launcher, here spelled as a module
    cmd, env = translate(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "-m", "pkg.train"]
    )
    assert cmd == [sys.executable, "-m", "pkg.train"] and env["ACCELERATE_MIXED_PRECISION"] == "no"


@pytest.mark.parametrize("machine_rank", ["0", "1"])
def test_accelerate_launch_on_several_machines_stands_for_the_whole_job(machine_rank):
    # accelerate's --num_processes counts every machine's processes; torchrun gets them per node.
    # Whichever machine's command is checked, the job is all of them, as torchrun's --nnodes is.
    from torch_neuronx.readiness.launch.launchers import read

    argv = ["--multi_gpu", "--num_machines", "2", "--machine_rank", machine_rank, "--num_processes", "8"]
    argv += ["--main_process_ip", "10.0.0.1", "--main_process_port", "29555", "train.py"]
    command, _ = read(["accelerate", "launch", *argv])
    assert command.torchrun and (command.nnodes, command.nproc_per_node) == (2, "4")
    assert command.target == ["train.py"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_dry_run_of_an_accelerate_launch_on_two_machines_answers_for_every_rank(tmp_path):
    argv = ["--multi_gpu", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "4"]
    argv += ["--main_process_ip", "127.0.0.1", "--main_process_port", "29561", str(SCRIPT)]
    report = _report(tmp_path, "dry", "accelerate", "launch", *argv)
    assert report["world_size"] == 4, report.get("world_size")


@pytest.mark.parametrize(
    "cmd, says",
    [
        (["bash", "run.sh"], "cannot run 'bash'"),
        (["deepspeed", "train.py"], "cannot run 'deepspeed'"),
        (["accelerate", "launch", "--use_deepspeed", "--num_processes", "2", "train.py"], "DeepSpeed"),
    ],
    ids=["bash", "deepspeed", "accelerate-deepspeed"],
)
def test_a_command_check_cannot_run_is_a_usage_error_that_lists_what_it_runs(tmp_path, cmd, says):
    p = _check(tmp_path / "out", False, *cmd)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("torch-neuronx check: error: ") and says in err, err
    if "cannot run" in says:
        for accepted in ("python script.py", "torchrun", "python -m torch.distributed.run", "accelerate launch",
                         "console script with a Python entry point"):  # fmt: skip
            assert accepted in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_launch_ddp_two_processes_real_and_dry_run(tmp_path):
    cmd = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2", str(SCRIPT))
    real, dry = _report(tmp_path, "real", *cmd), _report(tmp_path, "dry", *cmd)
    for r in (real, dry):
        assert r["verdict"] == "runs natively" and r["steps"] == 3, r["verdict"]
        assert [m["rank"] for m in r["memory_per_rank"]] == [0, 1]
        assert r["across_ranks"]["findings"] == []
    assert _collectives(dry) == _collectives(real)
    bucket = ("allreduce", "float32", 4 * (256 * 512 + 512 + 512 * 256 + 256), 2, 1.0)  # DDP's one bucket
    assert bucket in _collectives(real)
    for d, r in zip(dry["memory_per_rank"], real["memory_per_rank"]):  # AdamW's state too (made before prepare)
        assert abs(d["peak_allocated"] - r["peak_allocated"]) <= 0.01 * r["peak_allocated"], (d, r)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_launch_fsdp2_config_file_real_and_dry_run(tmp_path):
    config = tmp_path / "fsdp2.yaml"
    config.write_text(FSDP2)
    cmd = ("accelerate", "launch", "--config_file", str(config), str(SCRIPT))
    real, dry = _report(tmp_path, "real", *cmd), _report(tmp_path, "dry", *cmd)
    for r in (real, dry):
        assert r["verdict"] == "runs natively" and r["steps"] == 3, r["verdict"]
        assert [m["rank"] for m in r["memory_per_rank"]] == [0, 1]
    # FSDP2's all-gathers and reduce-scatters, in bf16 (the plugin's mixed precision from the config file)
    assert {(c[0], c[1]) for c in _collectives(real)} == {
        ("allgather_base", "bfloat16"),
        ("reduce_scatter_base", "bfloat16"),
    }
    assert _collectives(dry) == _collectives(real)
    for d, r in zip(dry["memory_per_rank"], real["memory_per_rank"]):
        assert abs(d["peak_allocated"] - r["peak_allocated"]) <= 0.02 * r["peak_allocated"], (d, r)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_launch_fsdp2_without_cpu_ram_efficient_loading_real_and_dry_run(tmp_path):
    """With fsdp_cpu_ram_efficient_loading false, fully_shard itself moves the host-built model to the
    device (``param.data = param.to(device)``): the dry run's parameters are on the device too, and
    the dry run's peak is the real run's within 1%."""
    config = tmp_path / "fsdp2.yaml"
    config.write_text(FSDP2.replace("cpu_ram_efficient_loading: true", "cpu_ram_efficient_loading: false"))
    cmd = ("accelerate", "launch", "--config_file", str(config), str(SCRIPT))
    real, dry = _report(tmp_path, "real", *cmd), _report(tmp_path, "dry", *cmd)
    for r in (real, dry):
        assert r["verdict"] == "runs natively" and r["steps"] == 3, r["verdict"]
        assert [m["rank"] for m in r["memory_per_rank"]] == [0, 1]
    assert _collectives(dry) == _collectives(real)
    assert {(c[0], c[1]) for c in _collectives(dry)} == {
        ("allgather_base", "bfloat16"),
        ("reduce_scatter_base", "bfloat16"),
    }
    for d, r in zip(dry["memory_per_rank"], real["memory_per_rank"]):
        assert abs(d["peak_allocated"] - r["peak_allocated"]) <= 0.01 * r["peak_allocated"], (d, r)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_launch_without_num_processes_starts_one_per_core_of_the_instance(tmp_path):
    """accelerate's default on neuron: as many processes as the instance has visible NeuronCores."""
    out = tmp_path / "dry"
    p = subprocess.run(
        [sys.executable, "-m", "torch_neuronx.cli", "check", "--dry-run", "--instance", "trn2.48xlarge", "--ranks",
         "0,63", "--out", str(out), "--", "accelerate", "launch", str(SCRIPT)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["world_size"] == 64 and report["ranks_run"] == [0, 63]
    assert report["verdict"].startswith("runs natively")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["real", "dry"])
def test_trl_sft_runs_as_the_accelerate_launch_trl_builds(tmp_path, mode):
    """The real run trains a tiny local model; the dry run loads a directory with only its config."""
    import shutil

    from torch_neuronx.demo.hf import build_base_checkpoint

    model = build_base_checkpoint(str(tmp_path / "base"))
    if mode == "dry":
        model = str(tmp_path / "config-only")
        shutil.copytree(tmp_path / "base", model, ignore=shutil.ignore_patterns("*.safetensors"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text((json.dumps({"text": "the cat sat on the mat. " * 4}) + "\n") * 16)
    out = tmp_path / mode
    p = _check(
        out, mode == "dry", "trl", "sft", "--num_processes", "1", "--model_name_or_path", model,
        "--dataset_name", str(tmp_path / "data"), "--output_dir", str(tmp_path / "sft"), "--max_steps", "2",
        "--per_device_train_batch_size", "2", "--max_length", "64", "--report_to", "none", "--save_strategy", "no",
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 2 and len(report["memory_per_rank"]) == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert report["fallbacks"] == [] and report["command"].startswith("trl sft")
    if mode == "real":
        assert p.returncode == 0 and report["verdict"] == "runs natively", p.stderr[-3000:]
        assert (tmp_path / "sft" / "config.json").exists()  # trl's sft.py ran to its end (it saves the model)
    else:
        assert [a["path"] for a in report["dry_run"]["absent_weights"]] == [model]
        # trl's script always saves the model at the end: the dry run writes its files without data
        assert p.returncode == 0 and report["errors"] == {}, p.stderr[-3000:]
        saved = report["dry_run"]["saved_without_data"]
        assert [Path(f["path"]).name for f in saved] == ["model.safetensors"], saved
        assert (tmp_path / "sft" / "config.json").exists()


@pytest.mark.slow
def test_a_console_script_runs_its_entry_point_under_check(tmp_path):
    report = _report(
        tmp_path, "real", "torch-neuronx", "demo", "--steps", "2", "--batch-size", "2", "--seq-len", "32",
        "--max-new-tokens", "2", "--samples", "1", "--out", str(tmp_path / "demo"), "--no-progress",
    )  # fmt: skip
    assert report["verdict"] == "runs natively" and report["steps"] == 2
    assert report["command"].startswith("torch-neuronx demo")


def test_a_module_whose_package_reads_sys_argv_on_import_gets_its_own_arguments(tmp_path):
    # torchtitan's package binds sys.argv[1:] when imported (a default argument of its config
    # parser), and torchrun -m torchtitan.train is how it is started: the dry run's scheduler must
    # not import the package before it forks the ranks, or they parse the scheduler's arguments.
    pkg = tmp_path / "argvpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import sys\n\nARGS = sys.argv[1:]\n")
    (pkg / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\n\nimport argvpkg\n\n"
        "assert argvpkg.ARGS == ['--steps', '2'], argvpkg.ARGS\n"
        "dist.init_process_group('neuron')\n"
        "x = torch.ones(4, device='neuron')\ndist.all_reduce(x)\ndist.destroy_process_group()\n"
    )
    cmd = ["torchrun", "--nproc-per-node", "2", "-m", "argvpkg.train", "--steps", "2"]
    report = _report(tmp_path, "dry", *cmd, path=(tmp_path,))
    assert not report["errors"] and sorted(m["rank"] for m in report["memory_per_rank"]) == [0, 1]


def test_the_file_python_m_runs_is_found_without_importing_its_package(tmp_path, monkeypatch):
    from torch_neuronx.readiness.launch.preimport import _module_path

    pkg = tmp_path / "sidepkg"
    (pkg / "tool").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "train.py").write_text("")
    (pkg / "tool" / "__init__.py").write_text("")
    (pkg / "tool" / "__main__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _module_path("sidepkg.train") == str(pkg / "train.py")
    assert _module_path("sidepkg.tool") == str(pkg / "tool" / "__main__.py")  # a package runs its __main__
    assert _module_path("sidepkg") is None and _module_path("sidepkg.train.x") is None
    assert "sidepkg" not in sys.modules
