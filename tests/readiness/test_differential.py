"""The dry run against the real run, on scripts written the way users write them.

Each script runs twice under ``torch-neuronx check``: on the simulated device, and with
``--dry-run`` (real size, no data). Where the real run completes, the dry run must too, and the
two must agree in what the report is made of, read from each rank's typed recording: the peak
memory of every rank (within 1%), the collectives (kind, dtype, bytes and the group they ran in,
in order), the compiled graphs and graph breaks, and the fallbacks. Where a dry run cannot agree
(a value it does not have), the case names the field that differs and asserts why.
"""

import collections
import dataclasses
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from torch_neuronx.readiness import Recording

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
DIFF = SCRIPTS / "differential"
EXAMPLES = REPO / "examples"


@dataclasses.dataclass
class Run:
    returncode: int
    output: str
    report: dict
    recordings: list  # Recording, by rank
    saved: dict = dataclasses.field(default_factory=dict)  # what the script saved (`_saved`)


def _saved(out: Path) -> dict:
    """The safetensors files and indexes a script wrote under `out`: path -> (size, header or index)."""
    found = {}
    for f in sorted(out.rglob("*.safetensors")) if out.is_dir() else ():
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            found[str(f.relative_to(out))] = (f.stat().st_size, fh.read(n))
    for f in sorted(out.rglob("*.safetensors.index.json")) if out.is_dir() else ():
        found[str(f.relative_to(out))] = (None, json.loads(f.read_text()))
    return found


def _check(out: Path, dry: bool, cmd: list) -> Run:
    """`torch-neuronx check [--dry-run] -- cmd`, its report and the ranks' recordings."""
    argv = [sys.executable, "-m", "torch_neuronx.cli", "check", "--out", str(out)] + (["--dry-run"] if dry else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(argv + ["--", *cmd], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    output = p.stdout[-3000:] + p.stderr[-6000:]
    assert (out / "report.json").exists(), output
    recs = [Recording.from_json(f.read_text()) for f in sorted((out / "recordings").glob("rank*.json"))]
    return Run(p.returncode, output, json.loads((out / "report.json").read_text()), sorted(recs, key=lambda r: r.rank))


def _collectives(rec: Recording) -> collections.Counter:
    """Every collective call of the run by (kind, dtype, bytes, group size)."""
    total = collections.Counter()
    for b in rec.buckets + rec.generation.forwards:
        total.update(b.collectives)
    return total


def _facets(run: Run) -> dict:
    """What the comparison reads from a run, per rank: the fields of the agreement."""
    recs = run.recordings
    return {
        "ranks": [r.rank for r in recs],
        "error": {r.rank: r.error for r in recs},
        "steps": {r.rank: r.steps for r in recs},
        "collectives": {r.rank: sorted(_collectives(r).items()) for r in recs},
        # the order and shapes of each group's collectives, and which ranks the group holds
        "groups": {r.rank: {g.desc: (g.ranks, [e[1:] for e in g.entries]) for g in r.groups.values()} for r in recs},
        # the compiled graphs by name, what each is made of (its matmuls and fused kernel), their runs
        "graphs": {r.rank: sorted(g["graph"] for g in r.compile.graphs) for r in recs},
        "graph_parts": {r.rank: r.graph_parts for r in recs},
        "graph_runs": {r.rank: sorted(sum((b.graphs for b in r.buckets), collections.Counter()).items()) for r in recs},
        "recompilations": {r.rank: len(r.compile.recompilations) for r in recs},
        "graph_breaks": {
            r.rank: sorted((b["reason"], b["site"], b["count"]) for b in r.compile.graph_breaks) for r in recs
        },
        "fallbacks": {r.rank: sorted((f.op, f.dtype, f.reason, f.count) for f in r.fallbacks) for r in recs},
        # the checkpoint files it saved: a dry run writes the same ones, headers and sizes, without data
        "saved": run.saved,
    }


def _peaks(run: Run) -> dict:
    return {(r.rank, core): m.peak_allocated for r in run.recordings for core, m in r.memory.items()}


def differences(real: Run, dry: Run) -> dict:
    """The fields in which the dry run does not agree with the real run: name -> (real, dry)."""
    fr, fd = _facets(real), _facets(dry)
    out = {k: (fr[k], fd[k]) for k in fr if fr[k] != fd[k]}
    pr, pd = _peaks(real), _peaks(dry)
    if pr.keys() != pd.keys() or any(abs(pd[k] - v) > 0.01 * v for k, v in pr.items()):
        out["peak_memory"] = (pr, pd)
    return out


@dataclasses.dataclass
class Case:
    cmd: list  # {out} is replaced by a directory of the test's own
    ranks: int = 1
    # field -> (why the dry run cannot agree, an assertion on (real, dry) that says how it differs)
    differs: dict = dataclasses.field(default_factory=dict)
    xfail: str | None = None
    saves: bool = False  # the script saves a checkpoint under {out}


def _torchrun(script, *args) -> list:
    return ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), *args]


def _python(script, *args) -> list:
    return [sys.executable, str(script), *args]


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def _self_check_exits(script: Path, message: str, value_line: str):
    """The example ends by comparing its result with a single-core run's, by value: the dry run
    reads the difference as its placeholder (1.0), which is above the tolerance, so the script exits
    with its own failure message there, after everything the comparison reads has run."""

    def check(real: Run, dry: Run):
        assert all(r.error is None for r in real.recordings)
        assert {r.error for r in dry.recordings} == {f"SystemExit: {message}"}, dry.output
        sites = {v.site.rsplit("/", 1)[-1].split(" ")[0] for v in dry.recordings[0].value_reads if not v.assumed}
        assert f"{script.name}:{_line(script, value_line)}" in sites, sites

    return check


def _last_stage_self_check_exits(real: Run, dry: Run):
    """The pipeline example's last stage compares its losses with a single-core run's by value: the
    dry run reads the difference as its placeholder (1.0), above the tolerance, so that rank exits
    with the script's own failure message, after everything the comparison reads has run. The first
    stage computes no loss: its difference is its own zero, and the max all-reduce leaves it so."""
    script = EXAMPLES / "pipeline.py"
    assert all(r.error is None for r in real.recordings)
    message = "SystemExit: pipeline losses differ from the single-core run"
    assert [r.error for r in dry.recordings] == [None, message], dry.output
    sites = {v.site.rsplit("/", 1)[-1].split(" ")[0] for v in dry.recordings[1].value_reads if not v.assumed}
    assert f"{script.name}:{_line(script, 'if worst.item() > 1e-5')}" in sites, sites


def _transformers_takes_a_traces_path_for_fake_tensors(real: Run, dry: Run):
    """transformers' ``is_tracing`` is true of every fake tensor, so in a dry run a causal LM takes a
    compiler trace's path, which reads no values: it builds the causal mask and repeats the grouped
    key/value heads for attention, where the real run reads that each row's position ids are one
    sequence and uses the kernel's causal flag. The dry run's peak holds those (48 KiB more on each
    rank, 2.3%), as an upper bound; transformers is not patched."""
    pr, pd = _peaks(real), _peaks(dry)
    assert pr.keys() == pd.keys()
    for k, v in pr.items():
        assert v < pd[k] <= 1.03 * v, (pr, pd)


def _moe_routing_is_data(real: Run, dry: Run):
    """Each rank counts the tokens its router sends to every expert (`bincount`) and exchanges the
    counts to size the uneven all-to-all: the counts are the data, which a dry run does not have,
    so it stops there with ValueUnknownError naming the line (a guess would give other bytes).
    What it did not run (the all-to-alls, the backward) differs too."""
    script = EXAMPLES / "moe.py"
    assert all(r.error is None for r in real.recordings)
    line = _line(script, "counts = torch.bincount(")
    for r in dry.recordings:
        assert r.error.startswith(f"ValueUnknownError: dry run: aten::bincount at {script}:{line} (forward)"), r.error
    assert dry.report["verdict"].startswith("failed on rank 0: ValueUnknownError"), dry.report["verdict"]
    assert all(_collectives(r) == collections.Counter() for r in dry.recordings)
    assert all(_collectives(r) for r in real.recordings)


def _compiled_graphs_run_op_by_op(real: Run, dry: Run):
    """A dry run compiles the same graphs but generates no code: each graph's ops run one by one on
    fake tensors, so every intermediate inside a compiled graph counts at its peak (an upper bound
    of the fused kernel's, documented as about 1.3x on a small MLP)."""
    pr, pd = _peaks(real), _peaks(dry)
    assert pr.keys() == pd.keys()
    for k, v in pr.items():
        assert v < pd[k] <= 1.3 * v, (pr, pd)


CASES = {
    # builds its optimizer before model.to("neuron"), as pytorch/examples does
    "ddp-pytorch-examples": Case(_torchrun(DIFF / "ddp_trainer.py"), ranks=2),
    "fsdp2": Case(_torchrun(DIFF / "fsdp2.py"), ranks=2),
    "tp-sp-dtensor": Case(
        _torchrun(DIFF / "tensor_parallel.py"),
        ranks=2,
    ),
    # compiled in place: the run's first module call is compiled code, hooks and all
    "compiled-module-data-parallel": Case(
        _torchrun(DIFF / "compiled_module.py"),
        ranks=2,
        differs={"peak_memory": _compiled_graphs_run_op_by_op},
    ),
    # blocks compiled one by one behind an eager embedding, whose DTensor redistribution (an
    # all-to-all, Shard(2) to Shard(1)) makes the first block's input
    "tp-sp-compiled-blocks": Case(_torchrun(DIFF / "tp_compiled_blocks.py"), ranks=2),
    "pipeline-gpipe": Case(
        _torchrun(EXAMPLES / "pipeline.py", "--layers", "2", "--steps", "2", "--batch-size", "8"),
        ranks=2,
        differs={"error": _last_stage_self_check_exits},
    ),
    "context-parallel": Case(
        _torchrun(EXAMPLES / "context_parallel.py", "--seq", "64"),
        ranks=2,
        differs={
            "error": _self_check_exits(
                EXAMPLES / "context_parallel.py",
                "context-parallel attention differs from the single-core run",
                "worst = max(",
            ),
        },
    ),
    "moe-expert-parallel": Case(
        _torchrun(EXAMPLES / "moe.py", "--experts", "4", "--tokens", "32"),
        ranks=2,
        differs=dict.fromkeys(("error", "collectives", "groups", "peak_memory"), _moe_routing_is_data),
    ),
    "hf-trainer-ddp": Case(
        _torchrun(SCRIPTS / "trainer_ddp.py", "{out}"),
        ranks=2,
        differs={"peak_memory": _transformers_takes_a_traces_path_for_fake_tensors},
    ),
    "trl-sft": Case(
        _python(
            EXAMPLES / "sft.py",
            "--output_dir",
            "{out}",
            "--base_model_dir",
            "{base}",
            "--max_steps",
            "2",
            "--max_length",
            "64",
            "--per_device_train_batch_size",
            "2",
            "--save_final",
            "true",
            "--logging_steps",
            "1",
        ),  # fmt: skip
        saves=True,
    ),
    "peft-lora": Case(_python(DIFF / "peft_lora.py")),
    "diffusers-unet-loop": Case(_python(DIFF / "denoise.py")),
    "generate-dynamic-cache": Case(_python(DIFF / "generate_cache.py", "dynamic")),
    "generate-static-cache": Case(_python(DIFF / "generate_cache.py", "static")),
    "torch-compile-training": Case(
        _python(DIFF / "compiled_train.py"), differs={"peak_memory": _compiled_graphs_run_op_by_op}
    ),
}


def _param(name: str, case: Case):
    marks = [pytest.mark.slow, pytest.mark.multiprocess] if case.ranks > 1 else []
    if case.xfail:
        marks.append(pytest.mark.xfail(strict=True, reason=case.xfail))
    return pytest.param(case, id=name, marks=marks)


@pytest.mark.parametrize("case", [_param(n, c) for n, c in CASES.items()])
def test_the_dry_run_agrees_with_the_real_run(tmp_path, case):
    def run(kind: str) -> Run:
        out = tmp_path / f"script-out-{kind}"  # each run's own: what each saved is compared
        done = _check(tmp_path / kind, kind == "dry", [a.format(out=out, base=tmp_path / "base") for a in case.cmd])
        done.saved = _saved(out)
        return done

    real = run("real")  # first: it writes what the dry run may load (a base model)
    assert real.returncode == 0 and len(real.recordings) == case.ranks, real.output
    assert all(r.error is None for r in real.recordings), real.output
    assert bool(real.saved) == case.saves, sorted(real.saved)
    dry = run("dry")
    assert len(dry.recordings) == case.ranks and all(r.dry_run for r in dry.recordings), dry.output
    diffs = differences(real, dry)
    assert not diffs.keys() - case.differs.keys(), {k: v for k, v in diffs.items() if k not in case.differs}
    for check in dict.fromkeys(case.differs.values()):  # each says how its fields differ, and why
        check(real, dry)
    if not case.differs:
        assert dry.returncode == 0, dry.output
        assert real.report["verdict"] == dry.report["verdict"], (real.report["verdict"], dry.report["verdict"])
