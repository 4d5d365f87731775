"""Unknown keyword arguments of ``nl.*`` / ``nisa.*`` calls raise ``TypeError``.

Every public function of those modules declares the keywords AWS's NKI reference
lists for it (the ones the simulator does not need, such as ``name=``, are accepted
and ignored); a misspelt keyword (``dts=`` for ``dst=``) must not be dropped silently.
Python would reject it already; the wrapper installed here only names the NKI function,
suggests the closest accepted keyword and lists them all.
"""

import difflib
import functools
import inspect
import types

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keyword(qualname, key, accepted):
    """The TypeError for keyword ``key`` that ``qualname`` does not accept."""
    near = difflib.get_close_matches(key, list(accepted), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    names = ", ".join(sorted(accepted)) or "none"
    return TypeError(f"{qualname}() got an unexpected keyword argument {key!r}{hint} (keywords it accepts: {names})")


def _checked(fn, qualname):
    accepted = frozenset(n for n, p in inspect.signature(fn).parameters.items() if p.kind in _NAMED)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for key in kwargs:
            if key not in accepted:
                raise unexpected_keyword(qualname, key, accepted)
        return fn(*args, **kwargs)

    return call


def install(namespace, prefix, open_ended=()):
    """Wrap every public function defined in module ``namespace`` (its ``globals()``).

    A function may keep a ``**kwargs`` catch-all only if it is listed in
    ``open_ended`` (an instruction that is not simulated and refuses every call).
    """
    module = namespace["__name__"]
    for name, obj in list(namespace.items()):
        if name.startswith("_") or not isinstance(obj, types.FunctionType) or obj.__module__ != module:
            continue
        params = inspect.signature(obj).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            if name not in open_ended:
                raise RuntimeError(f"{prefix}.{name} takes **kwargs: declare the keywords NKI documents for it")
            continue
        namespace[name] = _checked(obj, f"{prefix}.{name}")
