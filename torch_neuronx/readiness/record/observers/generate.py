"""transformers' ``generate``, tapped for the phases observer: the model it runs, for each call."""

from __future__ import annotations

import functools

import torch

from ....distributed._after_import import after_import

_MODULE = "transformers.generation.utils"


class GenerateTap:
    """While installed, each call of transformers' ``GenerationMixin.generate`` (a model's own
    ``generate`` ends in it too) calls `on_generate(True)` at its start, which says whether to hook
    the model: the model then has forward hooks `pre` and `post` (as ``register_forward_pre_hook``
    and ``register_forward_hook(with_kwargs=True, always_call=True)`` take them) for the duration
    of that call only; `on_generate(False)` at its end. `hook_late()` hooks the model of the
    innermost call in progress that has none (the global hooks that saw its forwards are gone).

    Global hooks are read by every module call, code compiled before included; these are read by
    this model's calls only, during this call, and removed they leave its hook dictionaries as they
    were: code compiled before does not recompile (the tests check it). transformers may be
    imported after the tap is installed (by the script): ``generate`` is replaced on its import."""

    def __init__(self, pre, post, on_generate):
        self._pre, self._post, self._on_generate = pre, post, on_generate
        self._armed = False
        self._orig = None  # (GenerationMixin, the generate it had)
        self._calls: list = []  # the generate calls in progress: [model, its hooks' handles]

    def install(self) -> None:
        self._armed = True
        after_import(_MODULE, self._wrap, "the generation phases of readiness")

    def remove(self) -> None:
        self._armed = False
        if self._orig is not None:
            mixin, generate = self._orig
            mixin.generate = generate
            self._orig = None

    def _wrap(self, module) -> None:
        if not self._armed or self._orig is not None:
            return  # imported after the recording ended, or already wrapped
        mixin = module.GenerationMixin
        orig = vars(mixin)["generate"]

        @functools.wraps(orig)
        def generate(model, *args, **kwargs):
            call = [model, ()]
            self._calls.append(call)
            call[1] = self._hook(model) if self._on_generate(True) else ()
            try:
                return orig(model, *args, **kwargs)
            finally:
                self._calls.remove(call)
                for h in call[1]:
                    h.remove()
                self._on_generate(False)

        mixin.generate = generate
        self._orig = (mixin, orig)

    def hook_late(self) -> bool:
        """Hook the model of the innermost generate in progress, if it has no hooks yet: whether it did."""
        if not self._calls or self._calls[-1][1]:
            return False
        call = self._calls[-1]
        call[1] = self._hook(call[0])
        return bool(call[1])

    def _hook(self, model) -> tuple:
        if not isinstance(model, torch.nn.Module):
            return ()
        # Disabled for Dynamo: a model's call compiled before (transformers' compiled decode step)
        # runs its hooks inside the compiled region, where Dynamo would compile the hooks' own
        # frames (two new frames) with is_compiling() True, and they would never delimit a forward.
        return (
            model.register_forward_pre_hook(torch.compiler.disable(self._pre)),
            model.register_forward_hook(torch.compiler.disable(self._post), with_kwargs=True, always_call=True),
        )
