"""The taps a dry run installs: replacements of PyTorch's and other libraries' functions that make
a script's code behave on fake tensors as it does on real ones, for the run only.

A tap is anything with ``install()`` and ``remove()`` (:class:`Tap`); installing or removing twice
in a row changes nothing. The taps on private PyTorch details live in ``_torch_private`` (each
with its reason), the taps on other libraries and c10d's object collectives in this wing
(``objects``, ``checkpoints.saving``: safetensors' writes, ``torch.save`` and ``torch.load``); this module lists them for one run.
"""

from __future__ import annotations

from typing import Protocol

from .. import _torch_private as _tp
from .checkpoints.saving import SaveTap, TorchLoadTap, TorchSaveTap
from .objects import ObjectCollectivesTap
from .pipeline import shortened_steps_tap


class Tap(Protocol):
    def install(self) -> None: ...

    def remove(self) -> None: ...


def dry_run_taps(accounting, values, saved: list, unwritten) -> list:
    """The taps of one dry run, in the order they install: `accounting` sees storage resizes,
    `values` drops what it keeps of a swapped tensor and learns of aliases made by ``.data =``,
    `saved` collects the files saved without data, `unwritten` (``checkpoints.saving.Unwritten``)
    those torch.save did not write, which torch.load then refuses."""
    return [
        _tp.StorageResizeTap(accounting.on_resize),
        _tp.ForeachTap(),
        _tp.ShardingCacheTap(),
        _tp.BufferStorageTap(),
        _tp.ParameterClassTap(),
        ObjectCollectivesTap(values.assume),
        _tp.SwapTap(values.forget),
        _tp.DataSetterTap(values.share),
        _tp.ModuleConversionTap(),
        _tp.StoragePointerTap(),
        _tp.FakeDataPointerTap(),
        SaveTap(saved.append),
        TorchSaveTap(saved.append, unwritten),
        TorchLoadTap(unwritten),
        shortened_steps_tap(),
    ]
