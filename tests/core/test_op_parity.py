"""Op parity of the ``neuron`` device against CPU, driven by PyTorch's OpInfo database.

For every OpInfo in ``op_db`` and every dtype of (float32, bfloat16, int64, bool)
that the OpInfo supports on CPU, the first few sample inputs run on CPU and on
copies moved to ``neuron``; outputs, in-place-mutated inputs and (for floating
dtypes of differentiable ops) input gradients must agree.

Rules:
* A sample whose CPU forward raises is dropped; an (op, dtype) pair with no
  sample that runs on CPU is excluded (not counted).
* CPU runs twice with the same seed; samples whose two CPU runs differ are
  nondeterministic and dropped (as are the ops in ``SKIP_OPS``).  Random ops run
  on CPU and on neuron with the same seed, inside ``torch_neuronx.cpu_equal_rng()``
  (neuron's own generator draws other numbers than CPU's), and must agree.
* Floats use ``assert_close`` defaults (NaN equal); integers and bools are exact.
  Bit-exactness of floats is recorded in the report as an extra statistic.
* Known failures (``KNOWN_FAILURES``) are still counted as failures in the pass
  rate; the list exists to document why, for the README.

Writes ``out/op_parity.json``.  Run with::

    pytest -m slow tests/core/test_op_parity.py -s
"""

import collections
import json
import os
import re
import time
import traceback
import warnings
from itertools import islice
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import torch_neuronx

DEVICE = "neuron"
SEED = 1234
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
GRAD_DTYPES = (torch.float32, torch.bfloat16)
MAX_SAMPLES = 4
MIN_PASS_RATE = 0.995
REPORT = os.path.join(Path(__file__).resolve().parents[2], "out", "op_parity.json")

# Ops whose result is not a function of their inputs (uninitialized memory).
SKIP_OPS = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
}

# (op full name, dtype name or None for all dtypes) -> reason.  Counted as failures.
_SPARSE = "sparse layouts are unsupported on neuron by design (Trainium has no sparse kernels): NotImplementedError"
KNOWN_FAILURES = {
    ("to_sparse", None): _SPARSE,
    ("sparse.sampled_addmm", None): _SPARSE,
    ("sparse.mm.reduce", None): _SPARSE,
}

# Ops whose positional arguments ATen requires on the host (as on CUDA):
# tensor_split's tensor_indices_or_sections.
HOST_ARGS = {"tensor_split"}


def full_name(op):
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def known_reason(name, dtype):
    return KNOWN_FAILURES.get((name, dtype_name(dtype))) or KNOWN_FAILURES.get((name, None))


# ---------------------------------------------------------------------------
# Moving samples between devices.
def _is_cpu_device(x):
    return (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu")


def to_device(obj, device, memo=None):
    """Fresh copy of ``obj`` on ``device``: tensors become leaves with the same
    requires_grad; aliasing between tensors of the sample is preserved; device
    arguments ('cpu') are retargeted."""
    if memo is None:
        memo = {}

    def move(x):
        if isinstance(x, torch.Tensor):
            key = id(x)
            if key not in memo:
                with torch.no_grad():
                    t = x.detach()
                    t = t.clone() if device == "cpu" else t.to(device)
                if x.requires_grad:
                    t.requires_grad_(True)
                memo[key] = t
            return memo[key]
        if device != "cpu" and _is_cpu_device(x):
            return torch.device(device) if isinstance(x, torch.device) else device
        return x

    return pytree.tree_map(move, obj)


def to_cpu(obj):
    def move(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu() if x.device.type != "cpu" else x.detach()
        return x

    return pytree.tree_map(move, obj)


def sample_parts(sample):
    return [sample.input, list(sample.args), dict(sample.kwargs)]


def leaves_requiring_grad(parts):
    return [t for t in pytree.tree_leaves(parts) if isinstance(t, torch.Tensor) and t.requires_grad]


# ---------------------------------------------------------------------------
# Comparison.
class Mismatch(AssertionError):
    pass


def bitwise_equal(a, e):
    if a.dtype != e.dtype or a.shape != e.shape:
        return False
    if a.is_conj() or a.is_neg() or e.is_conj() or e.is_neg():
        a, e = a.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg()
    a = a.reshape(-1).clone(memory_format=torch.contiguous_format)
    e = e.reshape(-1).clone(memory_format=torch.contiguous_format)
    return torch.equal(a.view(torch.uint8), e.view(torch.uint8))


def compare(actual, expected, what, exact=False, tensors_only=False):
    """Compare nested outputs; raise Mismatch.  Returns True if bitwise equal.

    ``tensors_only`` compares only the tensors (sample inputs after the op: their
    device arguments legitimately differ)."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if tensors_only:
        a_leaves = [x for x in a_leaves if isinstance(x, torch.Tensor)]
        e_leaves = [x for x in e_leaves if isinstance(x, torch.Tensor)]
        if len(a_leaves) != len(e_leaves):
            raise Mismatch(f"{what}: {len(a_leaves)} tensors vs {len(e_leaves)}")
    elif a_spec != e_spec:
        raise Mismatch(f"{what}: structure differs: {a_spec} vs {e_spec}")
    bitwise = True
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            raise Mismatch(f"{what}[{i}]: type differs: {type(a).__name__} vs {type(e).__name__}")
        if not isinstance(e, torch.Tensor):
            if isinstance(e, float) and isinstance(a, float) and e != e and a != a:
                continue
            if a != e:
                raise Mismatch(f"{what}[{i}]: {a!r} != {e!r}")
            continue
        if e.layout != torch.strided or a.layout != torch.strided:
            torch.testing.assert_close(a, e, equal_nan=True, check_device=False)
            continue
        if exact or not (e.is_floating_point() or e.is_complex()):
            try:
                torch.testing.assert_close(a, e, equal_nan=True, check_device=False, rtol=0, atol=0)
            except AssertionError as err:
                raise Mismatch(f"{what}[{i}]: {str(err).strip()}") from None
            continue
        try:
            torch.testing.assert_close(a, e, equal_nan=True, check_device=False)
        except AssertionError as err:
            raise Mismatch(f"{what}[{i}]: {str(err).strip()}") from None
        if a.numel() and not bitwise_equal(a, e):
            bitwise = False
    return bitwise


def check_output_devices(out, what):
    for i, t in enumerate(pytree.tree_leaves(out)):
        if isinstance(t, torch.Tensor) and t.device.type != DEVICE:
            raise Mismatch(f"{what}[{i}]: output on {t.device}, expected {DEVICE}")


# ---------------------------------------------------------------------------
# One run of a sample on one device: forward, then backward if requested.
def cotangents_for(outs):
    """Fixed cotangents (CPU) for the differentiable outputs ``outs``."""
    g = torch.Generator().manual_seed(SEED + 1)
    cots = []
    for o in outs:
        if o.is_complex():
            c = torch.randn(o.shape, generator=g, dtype=o.dtype)
        else:
            c = torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.dtype)
        cots.append(c)
    return cots


def run(op, sample, device, backward):
    parts = to_device(sample_parts(sample), device)
    if op.name in HOST_ARGS and device != "cpu":
        parts[1] = to_device(list(sample.args), "cpu")
    torch.manual_seed(SEED)  # seeds CPU and every neuron generator
    inp, args, kwargs = parts
    out = op(inp, *args, **kwargs)
    result = {"out": out, "parts": parts, "grads": None}
    if backward:
        leaves = leaves_requiring_grad(parts)
        diff_outs = [
            o
            for o in pytree.tree_leaves(out)
            if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex())
        ]
        if leaves and diff_outs:
            cots = [c.to(device) for c in cotangents_for(diff_outs)]
            loss = sum((o * c).sum() for o, c in zip(diff_outs, cots))
            if loss.is_complex():
                loss = loss.real
            result["grads"] = torch.autograd.grad(loss, leaves, allow_unused=True)
    return result


def short_error(err):
    msg = str(err).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(err).__name__}: {first}"[:400]


def error_key(msg):
    """Group key: error text with numbers, shapes and quoted names normalized."""
    k = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", msg)
    k = re.sub(r"\[[^\]]*\]", "[..]", k)
    return k[:160]


# ---------------------------------------------------------------------------
def check_pair(op, dtype):
    """Returns dict with status in {'excluded', 'nondeterministic', 'pass', 'fail'}."""
    name = full_name(op)
    backward = dtype in GRAD_DTYPES and op.supports_autograd
    rec = {"op": name, "dtype": dtype_name(dtype), "samples": 0, "backward": False, "bitwise": True}
    torch.manual_seed(SEED)
    try:
        samples = list(islice(op.sample_inputs("cpu", dtype, requires_grad=backward), MAX_SAMPLES))
    except Exception as err:  # noqa: BLE001
        rec.update(status="excluded", reason=f"sample_inputs failed: {short_error(err)}")
        return rec
    ran_on_cpu = 0
    nondet = 0
    failures = []
    for idx, sample in enumerate(samples):
        # CPU reference, twice.
        sample_backward = backward
        try:
            ref = run(op, sample, "cpu", backward)
        except Exception:  # noqa: BLE001
            if not backward:
                continue  # does not run on CPU: not counted
            try:
                ref = run(op, sample, "cpu", backward=False)
                sample_backward = False  # backward unsupported on CPU for this sample
            except Exception:  # noqa: BLE001
                continue
        ran_on_cpu += 1
        try:
            ref2 = run(op, sample, "cpu", sample_backward)
            compare(to_cpu(ref2["out"]), to_cpu(ref["out"]), "cpu-vs-cpu", exact=True)
            compare(to_cpu(ref2["parts"]), to_cpu(ref["parts"]), "cpu-vs-cpu-inputs", exact=True, tensors_only=True)
            if sample_backward:
                compare(to_cpu(ref2["grads"]), to_cpu(ref["grads"]), "cpu-vs-cpu-grads", exact=True)
        except Exception:  # noqa: BLE001
            nondet += 1
            continue
        # neuron.
        phase = "forward"
        try:
            res = run(op, sample, DEVICE, sample_backward)
            phase = "compare-output"
            check_output_devices(res["out"], "output")
            bit = compare(to_cpu(res["out"]), to_cpu(ref["out"]), "output")
            phase = "compare-inputs"
            bit &= compare(to_cpu(res["parts"]), to_cpu(ref["parts"]), "inputs-after-op", tensors_only=True)
            if sample_backward:
                phase = "compare-grads"
                bit &= compare(to_cpu(res["grads"]), to_cpu(ref["grads"]), "grad")
                rec["backward"] = rec["backward"] or ref["grads"] is not None
            rec["bitwise"] = rec["bitwise"] and bit
        except Exception as err:  # noqa: BLE001
            if phase == "forward" and sample_backward and not isinstance(err, Mismatch):
                # Was it the forward or the backward? Re-run forward only.
                try:
                    run(op, sample, DEVICE, backward=False)
                    phase = "backward"
                except Exception:  # noqa: BLE001
                    pass
            failures.append(
                {
                    "sample": idx,
                    "phase": phase,
                    "error": short_error(err),
                    "sample_repr": repr(sample)[:600],
                    "traceback": traceback.format_exc(limit=-3)[-1500:],
                }
            )
    rec["samples"] = ran_on_cpu - nondet
    if ran_on_cpu == 0:
        rec.update(status="excluded", reason="no sample runs on CPU")
    elif nondet == ran_on_cpu:
        rec.update(status="nondeterministic", reason="CPU results differ between two runs with the same seed")
    elif failures:
        rec.update(status="fail", failures=failures)
        reason = known_reason(name, dtype)
        if reason:
            rec["known"] = reason
    else:
        rec["status"] = "pass"
    return rec


def iter_pairs():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype in supported:
                yield op, dtype


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_op_parity():
    t0 = time.time()
    records = []
    skipped_ops = []
    with warnings.catch_warnings(), torch_neuronx.cpu_equal_rng():
        warnings.simplefilter("ignore")
        for op, dtype in iter_pairs():
            if op.name in SKIP_OPS:
                skipped_ops.append(f"{full_name(op)}:{dtype_name(dtype)}")
                continue
            t = time.time()
            rec = check_pair(op, dtype)
            rec["seconds"] = round(time.time() - t, 3)
            records.append(rec)
    elapsed = time.time() - t0

    tested = [r for r in records if r["status"] in ("pass", "fail")]
    passed = [r for r in tested if r["status"] == "pass"]
    failed = [r for r in tested if r["status"] == "fail"]
    rate = len(passed) / len(tested) if tested else 0.0

    groups = collections.defaultdict(list)
    for r in failed:
        first = r["failures"][0]
        key = error_key(first["error"])
        if first["error"].startswith("Mismatch"):
            key = f"{key} ({r['op']})"  # numeric mismatches: one group per op
        groups[(first["phase"], key)].append(r)

    report = {
        "torch": torch.__version__,
        "seed": SEED,
        "max_samples": MAX_SAMPLES,
        "seconds": round(elapsed, 1),
        "pairs_tested": len(tested),
        "pairs_passed": len(passed),
        "pass_rate": rate,
        "pairs_with_backward": sum(1 for r in tested if r["backward"]),
        "pairs_not_bitwise_equal": sorted(f"{r['op']}:{r['dtype']}" for r in passed if not r["bitwise"]),
        "excluded": sorted(f"{r['op']}:{r['dtype']} ({r['reason']})" for r in records if r["status"] == "excluded"),
        "nondeterministic": sorted(f"{r['op']}:{r['dtype']}" for r in records if r["status"] == "nondeterministic"),
        "skipped_ops": skipped_ops,
        "known_failures": {f"{k[0]}:{k[1] or '*'}": v for k, v in KNOWN_FAILURES.items()},
        "failure_groups": [
            {"phase": k[0], "error": k[1], "count": len(v), "pairs": [f"{r['op']}:{r['dtype']}" for r in v]}
            for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))
        ],
        "failures": failed,
        "slowest": sorted(
            ({"pair": f"{r['op']}:{r['dtype']}", "seconds": r["seconds"]} for r in records),
            key=lambda d: -d["seconds"],
        )[:20],
    }
    os.makedirs(os.path.dirname(REPORT), exist_ok=True)
    with open(REPORT, "w") as f:
        json.dump(report, f, indent=1, default=str)

    print(
        f"\nop parity vs CPU: {len(tested)} (op, dtype) pairs tested, {len(passed)} passed, "
        f"pass rate {rate:.2%} ({elapsed:.0f}s)"
    )
    print(
        f"  excluded (not runnable on CPU): {len(report['excluded'])}, "
        f"nondeterministic: {len(report['nondeterministic'])}, skipped: {len(skipped_ops)}, "
        f"passed but not bitwise equal: {len(report['pairs_not_bitwise_equal'])}"
    )
    for (phase, key), recs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        g = {"phase": phase, "error": key, "count": len(recs), "pairs": [f"{r['op']}:{r['dtype']}" for r in recs]}
        tag = " [known]" if all("known" in r for r in recs) else ""
        print(f"  {g['count']:3d} x [{g['phase']}] {g['error']}{tag}")
        print(f"        {', '.join(g['pairs'][:12])}{' ...' if len(g['pairs']) > 12 else ''}")
    print(f"  report: {REPORT}")
    assert rate >= MIN_PASS_RATE, f"pass rate {rate:.2%} < {MIN_PASS_RATE:.1%}; see {REPORT}"
