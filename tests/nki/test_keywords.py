"""Every nl.* / nisa.* call rejects keyword arguments it does not declare, and accepts
(and ignores) the ones NKI documents that do not change results, such as ``name=``."""

import inspect
import types

import numpy as np
import pytest

import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx import nki

RNG = np.random.default_rng(1)
NOT_SIMULATED = {"nl.all_reduce", "nisa.core_barrier", "nisa.sendrecv"}


def _public_calls():
    for prefix, mod in (("nl", nl), ("nisa", nisa)):
        for name in sorted(dir(mod)):
            obj = getattr(mod, name)
            if name.startswith("_") or f"{prefix}.{name}" in NOT_SIMULATED:
                continue
            if isinstance(obj, nl.Op) or (isinstance(obj, types.FunctionType) and obj.__module__ == mod.__name__):
                yield f"{prefix}.{name}", obj


CALLS = dict(_public_calls())


def test_the_surface_is_covered():
    # the check wraps the functions of both modules and the nl elementwise ops
    assert len(CALLS) > 100
    for key in ("nisa.nc_matmul", "nisa.dma_copy", "nisa.iota", "nisa.memset", "nl.load", "nl.sum", "nl.exp"):
        assert key in CALLS


@pytest.mark.parametrize("qualname", sorted(CALLS))
def test_unknown_keyword_is_a_type_error(qualname):
    with pytest.raises(TypeError, match=rf"{qualname}\(\) got an unexpected keyword argument 'no_such_kw'"):
        CALLS[qualname](no_such_kw=1)


def test_no_catch_all_kwargs_left():
    for qualname, fn in CALLS.items():
        if isinstance(fn, types.FunctionType):
            params = inspect.signature(fn).parameters.values()
            assert not any(p.kind is p.VAR_KEYWORD for p in params), qualname


def test_typo_suggests_the_keyword():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dts=r, src=t)
        nl.store(out, r)
        return out

    with pytest.raises(
        TypeError, match=r"nisa\.tensor_copy\(\) got an unexpected keyword argument 'dts'; did you mean"
    ):
        k(np.zeros((4, 8), np.float32))
    with pytest.raises(TypeError, match=r"nl\.exp\(\) got an unexpected keyword argument 'dtyp'; did you mean 'dtype'"):
        nl.exp(None, dtyp=nl.float32)
    with pytest.raises(TypeError, match=r"nisa\.nc_matmul\(\) .*'is_transposed'; did you mean 'is_transpose'"):
        nisa.nc_matmul(None, None, is_transposed=True)


def test_documented_keywords_are_accepted():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        ta = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.sbuf, name="ta")
        nisa.dma_copy(dst=ta, src=a, dge_mode=nisa.dge_mode.unknown, engine=nisa.engine.unknown, name="load_a")
        tb = nl.load(b, name="load_b")
        ps = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, ta, tb, name="mm")
        act = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(act, nl.exp, ps, scale=0.5, engine=nisa.engine.scalar, name="act")
        nl.store(out, act, name="store")
        return out

    a, b = RNG.standard_normal((16, 64)).astype(np.float32), RNG.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_allclose(k(a, b), np.exp(0.5 * (a.T @ b)), rtol=1e-5)


def test_keyword_forms_of_variadic_instructions():
    @nki.jit
    def k():
        out = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.shared_hbm)
        io = nl.ndarray((8, 12), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(io, pattern=[[1, 12]], offset=3, channel_multiplier=100)
        ones = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(ones, value=1.0, name="fill")
        sel = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(
            sel,
            pattern=[[-1, 12]],
            channel_multiplier=1,
            on_true_tile=ones,
            on_false_value=0.0,
            cmp_op=nl.greater_equal,
        )
        nl.store(out, nl.add(sel, nl.multiply(io, 1.0)))
        return out

    p, f = np.arange(8)[:, None], np.arange(12)[None, :]
    np.testing.assert_array_equal(k(), (p - f >= 0).astype(np.float32) + (3 + 100 * p + f))
