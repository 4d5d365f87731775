"""The dry run's dispatch mode: which ops run for real, which run fake, and what follows each.

It sits just above the fake mode (``_torch_private.new_fake_mode``) and below the recorder's. Each
op takes one route:

- a device query (``prim::device``) goes to the fake mode, which answers it;
- a higher-order op (flex_attention) passes whole to the fake mode, whose rule makes its outputs
  without the math's intermediates: the fused kernel's memory, as on the device;
- a value read (``item()``) is answered by the value store;
- a collective runs in PyTorch's fake process group (on real host tensors: for real), then the
  value rule gives its results (``collective_values``);
- an op on real host tensors only runs for real when its results are small (a DeviceMesh's rank
  table, a sampler's permutation, token counts keep their values), views and metadata changes
  too; larger host work (a model built on CPU before it moves) runs fake;
- everything else runs fake: shapes only.

After a fake run the value store keeps what is known of the results, and the accounting reserves
the new neuron storages.
"""

from __future__ import annotations

import torch

from ..._sites import frame_site, user_frame
from .. import _torch_private as _tp
from ..record.measure import PRIM_DEVICE
from .reads import ValueUnknownError

_aten = torch.ops.aten
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")
# Host (CPU) ops on real inputs whose results are under this size run for real, so small
# host work keeps its values: a DeviceMesh's rank table, a sampler's permutation, token
# counts. Larger host tensors (a model built on CPU before it moves) are fake too.
REAL_HOST_BYTES = 16 << 20
# DTensor's Shard(i) -> Shard(j): PyTorch's fake kernel narrows a concatenation of the group's
# inputs, where the real one returns a tensor of its own. So the fake result's storage is the
# group's size times the result's, and a size-1 batch dimension keeps the concatenation's stride,
# on which compiled code guards: a compiled layer fed that layout once and the real one after
# recompiles with dynamic shapes, which DTensor cannot hash.
_SHARD_DIM_ALLTOALL = torch.ops._dtensor.shard_dim_alltoall.default


class DryMode(_tp.TorchDispatchMode):
    """Routes each op of a dry run (see the module's docstring)."""

    supports_higher_order_operators = True

    def __init__(self, dry):
        super().__init__()
        self.dry = dry  # the DryExecutor: its lock, fake mode, value store and accounting

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Lets Dynamo trace a compiled region (as in a real run); the graph then runs here.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.dry.mode is not self:
            # A thread the script started during the run and that outlived it (a pool's worker)
            # still has the run's modes: its ops run for real, as in any other thread now.
            return _tp.run_real(func, args, kwargs or {})
        # One op at a time: a fake mode holds per-call state that threads must not share.
        with self.dry.lock:
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        if func is PRIM_DEVICE:  # a fake tensor's device, asked from C++: the fake mode answers
            return func(*args)
        if isinstance(func, _tp.HigherOrderOperator):
            _tp.let_fake_mode_run(func)
            out = func(*args, **kwargs)
            self.dry.accounting.account_outputs(func, out)
            return out
        if func is _aten._local_scalar_dense.default:
            return self._item(func, args, kwargs)
        if func.namespace in _COLLECTIVE_NAMESPACES:
            return self._collective(func, args, kwargs)
        if _tp.real_host_args(args, kwargs):
            return self._host_op(func, args, kwargs)
        if func is _SHARD_DIM_ALLTOALL:
            return self._after(func, args, kwargs, _shard_dim_alltoall_result(*args, **kwargs))
        return self._after(func, args, kwargs, self._fake_run(func, *self._fakes(args, kwargs), host=False))

    def _item(self, func, args, kwargs):
        # A DTensor's value is its local shard's (DTensor reads it there): a fake one has none.
        t = _tp.local(args[0])
        if not isinstance(t, _tp.FakeTensor):
            return _tp.run_real(func, args, kwargs)  # a real host tensor has its value
        return self.dry.values.item(t)

    def _collective(self, func, args, kwargs):
        """A collective in PyTorch's fake process group (it completes at once and moves nothing),
        its results then as the value rule says."""
        host = _tp.real_host_args(args, kwargs)
        out = _tp.run_real(func, args, kwargs) if host else self._fake_run(func, args, kwargs, False)
        self.dry.values.after_op(func, args, kwargs, out)
        if not host:
            self.dry.accounting.after_op(func, out)
        return _tp.completed_work(out)

    def _fakes(self, args, kwargs):
        """Large real inputs never reach the fake mode as they are: it would compute on them."""
        return _tp.fakeify(self.dry.fake_mode, args, kwargs, REAL_HOST_BYTES)

    def _host_op(self, func, args, kwargs):
        """An op whose tensors are all real host tensors: small work runs for real."""
        if func.is_view or torch.Tag.inplace_view in func.tags:
            # Views and metadata changes (set_ onto a storage, which is how safetensors points a
            # tensor at a checkpoint's memory map; t_, ...) make no data: run them on the real
            # tensors. A small result stays real, as its values exist; a large view goes fake
            # below. The fake mode refuses metadata changes of real tensors.
            out = _tp.run_real(func, args, kwargs)
            if not func.is_view or _tp.small_host_result(out, REAL_HOST_BYTES):
                return out
        fake_args, fake_kwargs = self._fakes(args, kwargs)
        if fake_args is not args or fake_kwargs is not kwargs:  # a large input: device-like work
            return self._after(func, fake_args, fake_kwargs, self._fake_run(func, fake_args, fake_kwargs, False))
        if _tp.host_result_is_small(func, args, kwargs, REAL_HOST_BYTES):
            return _tp.run_real(func, args, kwargs)
        out = self._fake_run(func, args, kwargs, host=True)
        if _tp.small_host_result(out, REAL_HOST_BYTES):
            # The fake mode may have run it for real already: never twice (a random op would draw twice).
            return out if not _tp.fake_inputs((out,), {}) else _tp.run_real(func, args, kwargs)
        return self._after(func, args, kwargs, out)

    def _after(self, func, args, kwargs, out):
        real = self.dry.values.after_op(func, args, kwargs, out)
        if real is not None:
            return real  # host results of known values: the script reads them
        self.dry.accounting.after_op(func, out)
        return out

    @staticmethod
    def _fake_run(func, args, kwargs, host: bool):
        """The fake run of an op: shapes only (its real run, for real host inputs it cannot fake)."""
        try:
            return func(*args, **kwargs)
        except Exception as e:
            if host:  # real host inputs (pin_memory, nonzero of a host mask, ...): the values are there
                return _tp.run_real(func, args, kwargs)
            if not isinstance(e, _tp.DATA_DEPENDENT):
                raise
            raise ValueUnknownError(
                f"dry run: {func.name()} at {frame_site(user_frame())} makes a tensor whose shape depends on "
                "tensor values, which a dry run does not compute. Run this script without --dry-run, or give "
                "the op a fixed-size form (e.g. a mask instead of nonzero)."
            ) from e


def _shard_dim_alltoall_result(input, gather_dim: int, shard_dim: int, group_name):
    """The result of ``_dtensor::shard_dim_alltoall`` as the real kernel makes it (fake): a
    contiguous tensor of its own, `gather_dim` grown and `shard_dim` shrunk by the group's size."""
    n = _tp.group_size(group_name)
    shape = list(input.shape)
    shape[gather_dim] *= n
    shape[shard_dim] //= n
    return torch.empty(shape, dtype=input.dtype, device=input.device)
