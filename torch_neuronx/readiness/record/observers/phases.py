"""The phases of a generation.

Top-level ``nn.Module`` forwards while no optimizer step has run: the phases of
inference. Each bucket runs from the start of one top-level forward to the start of the
next, or the end of its ``generate`` (a token's sampling counts with the forward that made it).

A forward is a decode step when it gets the same ``past_key_values`` object as the forward
before it and one token per sequence (``input_ids`` / ``inputs_embeds`` / its first tensor
argument of shape ``(batch, 1, ...)``), as ``generate`` calls it; any other is a prefill.
Forwards run inside torch.compile are not seen by module hooks (and the global hooks are
removed when a compile starts: Dynamo would trace them): each outermost call of a module's
call or method ``torch.compile``'d during the recording (``generate``'s compiled decode step, a
compiled model) starts a forward instead, classified by the same rule from the call's
arguments, with the compiled graphs it runs costed whole. A compiled submodule's call inside an
eager forward is part of that forward, and a compiled function of one's own is no forward.

Without global hooks (something was compiled before the recording, or a compile started in
it), transformers' ``generate`` still delimits its forwards: the model it runs has hooks of
its own for the duration of the call (``GenerateTap``; from the compile on, when a compile
starts inside one of its forwards that the global hooks saw). Other eager forwards are then not
delimited: they count with the forward before them. A compiled graph run outside any forward
of a generation in progress (a callable compiled before the recording, in a loop of one's
own) is noted, and the phases are then not estimated.
"""

from __future__ import annotations

import weakref

import torch

from ... import _torch_private
from ..recording import Bucket, Generation
from .generate import GenerateTap


class Phases:
    """The phases of a generation, as the module docstring describes them."""

    def __init__(self, spans):
        self.spans = spans
        self.forwards: list = []
        self._cur = None
        self._depth = 0
        self._top = None  # the module whose forward is in progress (at depth 1)
        self._off = False
        self._prev_cache = None
        self._handles = ()
        self._tap = None
        self._generate = GenerateTap(self._pre, self._post, self._generating)
        self._generates: list = []  # the generate calls in progress: whether each hooked its model
        self._between = False  # a generate ended and no forward started since
        self.compiled_outside = False

    def start(self) -> None:
        from torch.nn.modules import module

        self.spans.on_step(self.training)
        _torch_private.on_compile_start(self._on_compile)
        self._tap = _torch_private.CompiledCallTap(self._compiled_call)
        self._tap.install()
        self._generate.install()
        # Global module hooks change what Dynamo traces (and so its guards): code compiled
        # without them would recompile. So no global hooks once anything is compiled, and none
        # from the moment a compile starts; generate's hooks on its own model delimit its forwards.
        if _torch_private.dynamo_compiled_a_graph():
            return
        self._handles = (
            module.register_module_forward_pre_hook(self._pre),
            module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        )

    def _on_compile(self, _args=None) -> None:
        # Inside an eager forward (a compiled submodule or function it calls), the compile is part
        # of that forward; inside a call of a module compiled during the recording, that call is
        # the forward; inside a generate whose model has hooks of its own, they go on delimiting
        # its forwards. Elsewhere in a generation, its eager forwards from now on are not delimited.
        inside = self._depth > 0 or (self._tap is not None and self._tap.active()) or any(self._generates)
        self.compiled_outside = self.compiled_outside or (not inside and bool(self.forwards) and not self._between)
        if self._handles:
            # The global hooks go, and with them the post hooks of the forward in progress: a
            # generate's model gets hooks of its own, whose post hook ends it; any other forward
            # ends with the next one.
            if self._depth and self._generates and self._generate.hook_late():
                self._generates[-1] = True
                self._depth = 1
            else:
                self._depth, self._top = 0, None
        self._unhook(keep_forward=inside)

    def _unhook(self, keep_forward: bool = False) -> None:
        for h in self._handles:
            h.remove()
        self._handles = ()
        if not keep_forward:
            self._switch(None)

    def _switch(self, bucket) -> None:
        if self._cur is not None:
            self.spans.close(self._cur)
        self._cur = bucket
        if bucket is not None:
            self._between = False
            self.spans.open(bucket)

    def stop(self) -> None:
        _torch_private.on_compile_start(self._on_compile, remove=True)
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        self._generate.remove()
        self._unhook()

    def training(self) -> None:
        """An optimizer step ran: this is training, whose steps are the optimizer's."""
        self._off = True
        self.forwards.clear()
        self._switch(None)

    def graph_ran(self) -> None:
        """A compiled graph ran: outside an eager forward of a generation, the phases are unknown
        (after a generate ended, it is no generation's)."""
        if self._cur is None and not self._off and self.forwards and not self._between and not self._generates:
            self.compiled_outside = True

    def _generating(self, entering: bool) -> bool:
        """A generate starts (True: hook its model when no global hook sees its forwards) or ends
        (its last forward ends with it)."""
        if entering:
            self._generates.append(not self._handles and not self._off)
            return self._generates[-1]
        self._generates.pop()
        if not self._generates and not self._off:
            self._switch(None)
            self._between = True
        return False

    def _compiled_call(self, module, args, kwargs) -> None:
        """A torch.compile'd module call is made: a forward whose module hooks run compiled. One
        made inside an eager forward of another module (a compiled submodule) is part of that
        forward; the compiled call of the module whose forward hook just ran is that forward."""
        if self._off:
            return
        top = self._top
        if self._depth and module is not top and getattr(top, "_orig_mod", None) is not module:
            return
        if not self._depth or self._cur is None:
            self.forwards.append(Bucket())
            self._switch(self.forwards[-1])
        self._cur.phase, self._cur.tokens = self._classify(args, kwargs)

    def _inside_compiled_call(self) -> bool:
        """Compiling, or in a call of a compiled callable, which is the forward (``_compiled_call``)."""
        return torch.compiler.is_compiling() or (self._tap is not None and self._tap.active())

    def _pre(self, module, args):
        if self._inside_compiled_call():
            return
        self._depth += 1
        if self._depth == 1:
            self._top = module
        if self._depth == 1 and not self._off:
            self.forwards.append(Bucket())
            self._switch(self.forwards[-1])

    def _post(self, module, args, *kwargs_and_output):
        # (module, args, kwargs, output); a forward that raised gets (module, args, None):
        # PyTorch calls always-called global hooks without kwargs on that path.
        kwargs = kwargs_and_output[0] if len(kwargs_and_output) == 2 else {}
        if self._inside_compiled_call():
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0:
            self._top = None
            if self._cur is not None and self._cur.phase is None:
                self._cur.phase, self._cur.tokens = self._classify(args, kwargs)

    def _classify(self, args, kwargs) -> tuple:
        cache, tokens = kwargs.get("past_key_values"), _tokens(args, kwargs)
        prev, self._prev_cache = self._prev_cache, _weak(cache)
        same_cache = cache is not None and prev is not None and prev() is cache
        return ("decode" if same_cache and tokens == 1 else "prefill"), tokens

    def record(self) -> Generation:
        return Generation([b.typed() for b in self.forwards if b.phase is not None], self.compiled_outside)


def _tokens(args, kwargs) -> int | None:
    """Tokens per sequence of a forward: dimension 1 of its input ids (else embeddings, else first tensor)."""
    x = kwargs.get("input_ids")
    x = kwargs.get("inputs_embeds") if x is None else x
    if not isinstance(x, torch.Tensor):
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return int(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else None


def _weak(obj):
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep it (a cache lives as long as its generate anyway)
        return lambda: obj
