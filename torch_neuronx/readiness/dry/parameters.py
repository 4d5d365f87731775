"""The modules, parameters and optimizers of a dry run: what holds memory, and optimizers kept
pointed at the parameters that run.

On the device, ``module.to("neuron")`` keeps each Parameter object (it swaps the data in), so an
optimizer made before the move (Accelerate's ``prepare`` always does this) steps the device
parameters. A fake tensor cannot be swapped into a host Parameter, so in a dry run the module gets
new Parameter objects and the optimizer would hold the host ones, without gradients: it would
step nothing and hold no state. Before each step the optimizer is pointed at the new ones.
"""

from __future__ import annotations

import weakref

from .. import _torch_private as _tp


class Parameters:
    """Modules seen registering parameters, and optimizers seen stepping (weakly)."""

    def __init__(self):
        self._modules: weakref.WeakSet = weakref.WeakSet()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        # id(parameter) -> [(module ref, name)] it was registered as; not a weak reference to the
        # parameter: torch.utils.swap_tensors (FSDP2, DTensor) refuses tensors that have one
        self._registered: dict[int, list] = {}
        self._hooks: list = []

    def start(self) -> None:
        from torch.nn.modules.module import register_module_parameter_registration_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._hooks = [
            # not a global forward hook: torch.compile(module) warns about those
            register_module_parameter_registration_hook(self._on_parameter),
            register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._on_optimizer_step(opt)),
        ]

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _on_parameter(self, module, name, param) -> None:
        self._modules.add(module)
        if param is not None:
            self._registered.setdefault(id(param), []).append((weakref.ref(module), name))

    def _on_optimizer_step(self, opt) -> None:
        """Points the optimizer at the neuron parameters that replaced its host ones."""
        self._optimizers.add(opt)
        for group in opt.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                if p.device.type == "neuron" or p.grad is not None:
                    continue
                new = self._moved(p)
                if new is not None:
                    params[i] = new

    def _moved(self, p):
        """The neuron parameter a module holds in place of host parameter `p`, or None."""
        for ref, name in self._registered.get(id(p), ()):
            module = ref()
            new = _tp.own_parameter(module, name) if module is not None else None
            if (
                isinstance(new, _tp.FakeTensor)
                and new.device.type == "neuron"
                and (new.shape, new.requires_grad) == (p.shape, p.requires_grad)
            ):
                return new
        return None

    def held(self) -> tuple:
        """(parameters, optimizer state tensors) the run holds now."""
        params, state = [], []
        for m in list(self._modules):
            params.extend(_tp.own_parameters(m))
        for opt in list(self._optimizers):
            for g in opt.param_groups:
                params.extend(g["params"])
            for s in opt.state.values():
                state.extend(s.values())
        return params, state
