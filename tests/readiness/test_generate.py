"""The readiness estimate of a generation: prefill (time to first token) and decode step (time per
output token), from a real run and a dry run of generate, and the published-figure row it feeds."""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import torch_neuronx
from helpers import tiny_llama, worker_env
from torch_neuronx.readiness import Recording
from torch_neuronx.readiness.estimate import known_error as _known_error
from torch_neuronx.readiness.record import measure as _cost

REPO = Path(__file__).parents[2]
DATA = Path(__file__).parent / "data"
PROMPT, NEW = 512, 4


def _generate(dry_run: bool, compiled: bool = False):
    config = dict(vocab_size=512, hidden_size=256, intermediate_size=1024, max_position_embeddings=1024)
    with torch_neuronx.readiness(dry_run=dry_run) as r:
        model = tiny_llama(**config, bos_token_id=1, eos_token_id=2, pad_token_id=None).to("neuron")
        ids = torch.ones(1, PROMPT, dtype=torch.long, device="neuron")
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache_implementation="static",
                disable_compile=not compiled, pad_token_id=0,
            )  # fmt: skip
    return r.report, tuple(out.shape)


@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry"])
def test_generate_reports_a_prefill_and_a_cheaper_decode_step(dry_run, fresh_dynamo):  # nothing compiled before
    report, shape = _generate(dry_run)
    # a dry run knows the stopping flags built from the length: it stops at max_new_tokens
    assert shape == (1, PROMPT + NEW)
    est = report.data["estimates"][0]
    ph = est["phases"]
    pre, dec = ph["prefill"], ph["decode"]
    assert (pre["count"], pre["tokens"]) == (1, PROMPT)
    assert (dec["count"], dec["tokens"]) == (NEW - 1, 1)  # the first token comes from the prefill
    assert 0 < dec["seconds"] < pre["seconds"]
    for p in (pre, dec):
        assert set(p["term_shares"]) == set(est["terms"]) and sum(p["term_shares"].values()) == pytest.approx(1)
        assert p["dominant"] in p["terms"] and p["mfu"] is not None
    # the prefill's matmuls: every linear layer over the prompt (plus lm_head on the last token), and the
    # decode step's over one token: the prefill has about PROMPT times the decode step's FLOPs
    assert pre["model_flops"] / dec["model_flops"] == pytest.approx(PROMPT, rel=0.1)
    summary = report.summary()
    assert "prefill (time to first token)" in summary and "decode step (time per output token)" in summary
    md = report.to_markdown()
    assert "Estimated generation phases" in md
    assert json.loads(report.to_json())["estimates"][0]["phases"]["decode"]["count"] == NEW - 1


def test_a_compiled_decode_step_is_a_phase_costed_as_its_graph(fresh_dynamo):
    """generate compiles its decode step (a static cache on neuron): each call of the compiled
    forward is a decode step, costed from the graph it runs, and a dry run agrees with a real run."""
    eager = _generate(False)[0].data["estimates"][0]["phases"]["decode"]  # before anything is compiled
    phases = {}
    for dry_run in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # nothing compiled before the recording (see fresh_dynamo)
        report, shape = _generate(dry_run, compiled=True)
        assert shape == (1, PROMPT + NEW)
        rec = report.data["estimates"][0]
        phases[dry_run] = rec["phases"]
        dec = rec["phases"]["decode"]
        assert (dec["count"], dec["tokens"]) == (NEW - 1, 1)
        # the decode step's time is mostly its compiled graph's, whole
        (graph,) = [o for o in dec["ops"] if o["op"].startswith("compiled graph")]
        assert graph["count"] == 1 and graph["seconds"] > 0.5 * dec["seconds"]
    # fused, the step pays fewer per-op fixed costs than the same step run eagerly
    assert phases[False]["decode"]["seconds"] < eager["seconds"]
    for phase in ("prefill", "decode"):
        assert phases[True][phase]["seconds"] == pytest.approx(phases[False][phase]["seconds"], rel=0.01)


@pytest.mark.parametrize(
    "dry_run, compiled_before, compiled_inside",
    [
        (False, True, None),
        (True, True, None),
        (False, False, "function"),
        (False, True, "submodule"),
        (False, False, "submodule"),
        (True, False, "submodule"),
        (False, False, "helper"),
        (False, False, "forward"),
    ],
    ids=[
        "real",
        "dry",
        "function-compiled-inside",
        "submodule-compiled-inside",
        "submodule-compiled-first",
        "submodule-compiled-first-dry",
        "helper-compiled-in-forward",
        "forward-compiled-inside",
    ],
)
def test_an_eager_generate_after_something_was_compiled_is_split_into_phases(
    dry_run, compiled_before, compiled_inside, fresh_dynamo
):
    # Something compiled before the recording: no global module hooks (code compiled before would
    # see them), but generate's model gets hooks of its own for the call, which delimit its forwards;
    # the function compiled before runs as it was compiled, without recompiling. A function compiled
    # in the recording (as `torch-neuronx check` sees a script that compiles) is not a forward, nor
    # is a compiled helper called in the forward; a compiled submodule's call is part of the forward
    # it is called in (compiled first, in the prefill, it removes the global hooks mid-forward:
    # generate's model then gets hooks of its own); a compiled model.forward is the forward.
    from torch._dynamo.utils import counters

    def compiled():
        return torch.compile(lambda x: (x * 2).sin(), backend="neuron")

    x, double = torch.ones(4, 8, device="neuron"), None
    if compiled_before:
        double = compiled()
        double(x)
    frames, graphs = dict(counters["frames"]), counters["stats"]["unique_graphs"]
    config = dict(vocab_size=512, hidden_size=256, intermediate_size=1024, max_position_embeddings=1024)
    model = tiny_llama(**config, bos_token_id=1, eos_token_id=2, pad_token_id=None).to("neuron")
    with torch_neuronx.readiness(dry_run=dry_run) as r:
        if compiled_inside == "function":
            double = compiled()
        elif compiled_inside == "submodule":
            model.model.layers[0].mlp.compile(backend="neuron")
        elif compiled_inside == "helper":
            mlp = model.model.layers[0].mlp
            del mlp.act_fn  # a module: a function takes its place as a plain attribute
            mlp.act_fn = torch.compile(lambda h: torch.nn.functional.silu(h), backend="neuron")
        elif compiled_inside == "forward":
            model.forward = torch.compile(model.forward, backend="neuron")
        if (
            not dry_run and double is not None
        ):  # a dry run's tensors are fake: the compiled function would not take them as it did
            double(x)
        ids = torch.ones(1, PROMPT, dtype=torch.long, device="neuron")
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache_implementation="static",
                disable_compile=True, pad_token_id=0,
            )  # fmt: skip
        if not dry_run and double is not None:
            double(x)  # after the generation: none of its forwards
    assert tuple(out.shape) == (1, PROMPT + NEW)
    if compiled_inside is None:
        assert (dict(counters["frames"]), counters["stats"]["unique_graphs"]) == (frames, graphs)  # no recompile
    assert not model._forward_pre_hooks and not model._forward_hooks  # the generate's hooks are gone
    assert not r.recording.generation.compiled_outside
    ph = r.report.data["estimates"][0]["phases"]
    pre, dec = ph["prefill"], ph["decode"]
    assert (pre["count"], pre["tokens"], dec["count"], dec["tokens"]) == (1, PROMPT, NEW - 1, 1)
    assert 0 < dec["seconds"] < pre["seconds"]


def test_generates_compiled_decode_step_compiled_before_the_recording_is_split_into_phases(fresh_dynamo):
    # A warm-up generate compiled the decode step (a static cache on neuron) before the recording:
    # the hooks on the model then run inside that compiled call, and must neither be compiled by
    # Dynamo (new frames, hooks that never run) nor make it recompile
    from torch._dynamo.utils import counters

    config = dict(vocab_size=512, hidden_size=256, intermediate_size=1024, max_position_embeddings=1024)
    model = tiny_llama(**config, bos_token_id=1, eos_token_id=2, pad_token_id=None).to("neuron")
    ids = torch.ones(1, 64, dtype=torch.long, device="neuron")
    kwargs = dict(
        max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache_implementation="static", pad_token_id=0
    )
    with torch.no_grad():
        model.generate(ids, **kwargs)  # compiles the decode step
        frames = dict(counters["frames"])
        with torch_neuronx.readiness() as r:
            model.generate(ids, **kwargs)
    assert dict(counters["frames"]) == frames  # no recompile, no frame of the recording's own
    ph = r.report.data["estimates"][0]["phases"]
    assert (ph["prefill"]["count"], ph["prefill"]["tokens"], ph["decode"]["count"]) == (1, 64, NEW - 1)
    assert any(o["op"].startswith("compiled graph") for o in ph["decode"]["ops"])  # the decode step's graph


def test_a_forward_that_raises_is_closed_like_one_that_returns():
    # PyTorch calls always-called global forward hooks without kwargs when a forward raises;
    # the recording's hook takes both forms (before, it failed and PyTorch warned).
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    with torch_neuronx.readiness() as r, warnings.catch_warnings():
        # PyTorch turns a hook's exception on that path into a warning: make any warning fail
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="boom"):
            Boom()(torch.ones(1, 2, device="neuron"))
    # the hook ran: the forward was closed and classified, as a returning one is
    (forward,) = r.recording.generation.forwards
    assert (forward.phase, forward.tokens) == ("prefill", 2)


def test_training_has_no_phases():
    model = torch.nn.Linear(64, 64).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_neuronx.readiness() as r:
        for _ in range(2):
            model(torch.randn(8, 64, device="neuron")).sum().backward()
            opt.step()
    assert r.report.data["estimates"][0]["phases"] is None
    assert "prefill" not in r.report.summary()


def test_a_static_cache_update_moves_only_the_rows_it_writes():
    cache = torch.zeros(1, 2, 1000, 64, device="neuron")
    new = torch.ones(1, 2, 1, 64, device="neuron")
    pos = torch.tensor([5], device="neuron")
    assert _cost.moved_bytes("aten::index_copy_", [cache, pos, new], [cache]) == 2 * (new.nbytes + pos.nbytes)
    # an embedding lookup reads the rows it selects, not the whole table
    table, ids = torch.zeros(1000, 64, device="neuron"), torch.tensor([[3, 5]], device="neuron")
    rows = torch.nn.functional.embedding(ids, table)
    assert _cost.moved_bytes("aten::embedding", [table, ids], [rows]) == ids.nbytes + 2 * rows.nbytes
    out = torch.cat([cache, new], dim=2)  # a dynamic cache's cat reads and writes it all
    assert _cost.moved_bytes("aten::cat", [cache, new], [out]) == cache.nbytes + new.nbytes + out.nbytes


@pytest.mark.multiprocess
def test_the_405b_rows_sequence_parallel_plan_generates_what_llamas_own_plan_does():
    """The plan that reproduces NxD Inference's sequence-parallel prefill is a correct program: on 2
    ranks, greedy generate gives the same tokens and scores as Llama's plain tensor-parallel plan,
    and the second decoder layer gets each rank's half of the prompt in the prefill."""
    script = Path(__file__).parent / "scripts" / "sequence_parallel_generate.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # the ranks share stdout: their lines can run together
    found = re.findall(r"RANK (\d) ROWS (\S+) TOKENS_EQUAL (\w+) SAME_INF (\w+) MAXDIFF ([-+.0-9e]+)", p.stdout)
    assert sorted(f[0] for f in found) == ["0", "1"], p.stdout
    for _, rows, tokens_equal, same_inf, diff in found:
        assert (rows, tokens_equal, same_inf) == ("16,8", "True", "True") and float(diff) <= 1e-5, p.stdout


def test_llama_405b_row_from_its_saved_recording():
    """Pins the estimate of AWS's published Llama-3.1-405B inference figures from the recording of
    the dry run (benchmarks/published_inference.py --save-raw): a change of the model that moves it shows here."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_inference as pi
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    raw = Recording.from_json((DATA / "llama405b_tp64_raw.json").read_text())
    assert raw.extra["layers"] == 126 and raw.world_size in (64, "64")
    ttft, tpot = (f(raw) for f in pi.EAGER_ROWS)
    for row in (ttft, tpot):
        assert set(row) >= {"figure", "configuration", "aws", "estimate", "unit", "ratio", "mfu"}
    assert (ttft["aws"], tpot["aws"]) == (2442.0, 37.9)
    assert ttft["estimate"] == pytest.approx(PINNED_TTFT.estimate, rel=1e-3)
    assert tpot["estimate"] == pytest.approx(PINNED_TPOT.estimate, rel=1e-3)
    assert ttft["ratio"] == pytest.approx(ttft["estimate"] / 2442.0, abs=1e-3)
    for row, known in ((ttft, PINNED_TTFT), (tpot, PINNED_TPOT)):  # the table reports print their error from
        assert row["aws"] == known.aws and row["ratio"] == pytest.approx(known.ratio, rel=1e-3)
    # the prefill is NxD Inference's: its 10,240-token bucket, sequence-parallel (an all-gather before
    # attention and the MLP, a reduce-scatter after each, no all-reduce but the embeddings')
    prefill = pi.phases(raw).prefill
    assert prefill.tokens == 10_240
    calls = {o.op: o.count for o in prefill.ops if o.op.startswith("c10d::")}
    assert calls == {"c10d::allgather_base": 2 * 126 + 1, "c10d::reduce_scatter_base": 2 * 126, "c10d::all_reduce": 1}


# The pins are the known-error table's rows, from which reports print the model's error.
_405B = "trn2.48xlarge, TP=64"
PINNED_TTFT = _known_error.row(f"Llama-3.1-405B time to first token, {_405B}")  # all-gathers, reduce-scatters, matmuls
PINNED_TPOT = _known_error.row(f"Llama-3.1-405B time per output token, {_405B}")  # fixed costs and weight reads
PINNED_TTFT_COMPILED = _known_error.row(f"Llama-3.1-405B time to first token, {_405B}, compiled")
PINNED_TPOT_COMPILED = _known_error.row(f"Llama-3.1-405B time per output token, {_405B}, compiled")


def test_llama_405b_compiled_rows_from_their_saved_recording():
    """The same rows with the model's forward compiled (``--compiled``), as NxD Inference runs them:
    each phase is one run of its compiled graph, costed whole."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_inference as pi
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    raw = Recording.from_json((DATA / "llama405b_tp64_compiled.json").read_text())
    ttft, tpot = (f(raw) for f in pi.COMPILED_ROWS)
    for row, known in ((ttft, PINNED_TTFT_COMPILED), (tpot, PINNED_TPOT_COMPILED)):
        assert row["estimate"] == pytest.approx(known.estimate, rel=1e-3) and row["aws"] == known.aws
    phases = pi.phases(raw)
    for phase, count in (("prefill", 1), ("decode", NEW - 1)):
        p = getattr(phases, phase)
        graphs = [o for o in p.ops if o.op.startswith("compiled graph")]
        assert p.count == count and len(graphs) == 1 and graphs[0].count == 1
    # compiled, the decode step pays a fraction of the eager step's per-op fixed costs
    eager = pi.phases(Recording.from_json((DATA / "llama405b_tp64_raw.json").read_text())).decode
    assert phases.decode.terms["fixed"] < 0.5 * eager.terms["fixed"]


# The trn1 rows (transformers-neuronx's runs, compiled as it compiles them): each run's two
# recordings, the prefill's (static cache of the prompt) and the decode steps' (static cache of
# n_positions, the token bucket every step of AWS's run after the prompt attends over).
_TRN1 = "trn1.32xlarge, TP=32, compiled"


@pytest.mark.parametrize(
    "run, model, prompt, cache, layers",
    [("llama3_70b", "Llama-3-70B", 2048, 4096, 80), ("llama2_13b", "Llama-2-13b", 4096, 8192, 40)],
)
def test_trn1_rows_from_their_saved_recordings(run, model, prompt, cache, layers):
    """Pins the estimates of AWS's published Llama-3-70B and Llama-2-13b inference figures on
    trn1.32xlarge from the recordings of their dry runs (benchmarks/published_inference.py --run RUN
    --save-raw): a change of the model that moves them shows here."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_inference as pi
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    raws = pi.recording(str(DATA / f"{run}_trn1_tp32.json"))
    assert [r.extra.get("cache") for r in raws] == [None, cache]
    assert {(r.extra["run"], r.extra["layers"], r.world_size) for r in raws} == {(run, layers, 32)}
    ttft, tpot = (f(raws) for f in pi.TRN1_ROWS[run])
    pinned = [_known_error.row(f"{model} time to first token, {_TRN1}")]
    pinned += [_known_error.row(f"{model} time per output token, {_TRN1}")]
    for row, known in zip((ttft, tpot), pinned):
        assert set(row) >= {"figure", "configuration", "aws", "estimate", "unit", "ratio", "mfu"}
        assert row["aws"] == known.aws and row["estimate"] == pytest.approx(known.estimate, rel=1e-3, abs=0.05)
        assert row["ratio"] == pytest.approx(known.ratio, abs=1e-3) and known.chip == "trn1"  # rounded to 3 places
    prefill, decode = pi.phases(raws[0]).prefill, pi.phases(raws[1]).decode
    assert (prefill.count, prefill.tokens, decode.count, decode.tokens) == (1, prompt, NEW - 1, 1)
    for p in (prefill, decode):  # one compiled graph per phase; Llama's plain plan: 2 all-reduces a layer
        graphs = [o for o in p.ops if o.op.startswith("compiled graph")]
        assert len(graphs) == 1 and graphs[0].count == 1
        calls = {o.op: o.count for o in p.ops if o.op.startswith("c10d::")}
        assert calls == {"c10d::all_reduce": 2 * layers + 1, "c10d::all_gather_into_tensor": 1}
