"""The target a kernel assigns a call's result to (``b = nl.loop_reduce(a, ...)`` or
``z[m, :, n0:n1] = nl.loop_reduce(a, ...)``).

``nl.loop_reduce`` reads its destination (what the assignment target holds before the
call) as an operand. The NKI compiler sees that from the kernel's source; the
simulator does the same: it locates the running call in the caller's source by the
bytecode position CPython records for it.
"""

import ast
import functools
import itertools
import linecache
import sys


@functools.lru_cache(maxsize=64)
def _assign_targets(filename, source):
    """{(lineno, col, end_lineno, end_col) of an assigned call: target source text}."""
    if not source:
        return None
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return None
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            v = node.value
            t = node.targets[0] if len(node.targets) == 1 else None
            text = ast.unparse(t) if isinstance(t, (ast.Name, ast.Subscript)) else None
            out[(v.lineno, v.col_offset, v.end_lineno, v.end_col_offset)] = text
    return out


def assignment_target(skip_modules):
    """``(target, frame)``: the source text of the single target (a name or a subscript)
    of the assignment receiving the call running in the first frame outside
    ``skip_modules``; ``target`` is None when the call is not such a value."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in skip_modules:
        frame = frame.f_back
    if frame is None:
        return None, None
    pos = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None), None)
    filename = frame.f_code.co_filename
    targets = _assign_targets(filename, "".join(linecache.getlines(filename, frame.f_globals)))
    if pos is None or targets is None:
        return None, frame
    lineno, end_lineno, col, end_col = pos
    return targets.get((lineno, col, end_lineno, end_col)), frame
