"""The dry run's read policy: what it answers when a script reads a tensor value it does not have.

A read of a value (``loss.item()``, ``tolist()``, ``float(t)``) gets a placeholder and is
listed with its source line; a branch on a tensor's value (``if loss < x:``) in the user's
code stops the run with :class:`ValueUnknownError` naming the line, since either way would
be a guess (a library's own branch is taken as True and listed). A value the store assumed
(a finiteness check) is given and listed too.
"""

from __future__ import annotations

import collections

import torch

from ..._sites import frame_site, in_library, user_frame
from .. import _torch_private
from ..record.recording import ValueRead

PLACEHOLDER = {"int": 1, "float": 1.0, "bool": False}  # 1, not 0: a count read as a divisor must not be zero


class ValueUnknownError(RuntimeError):
    """Control flow depends on a tensor value, which a dry run does not have."""


class Reads:
    """The reads a dry run answered without the value, and the assumed values it gave."""

    def __init__(self):
        self.reads: collections.Counter = collections.Counter()  # (site, kind, placeholder) -> reads
        self.given: collections.Counter = collections.Counter()  # (site, check, value) -> reads

    def assumed(self, value):
        """`value`, assumed (a finiteness check's answer), listed at the reading line."""
        self.given[(frame_site(user_frame()), "finite", value)] += 1
        return value

    def answer(self, t: torch.Tensor):
        """The Python value a script gets for a fake tensor's ``item()`` whose value is not known."""
        f = user_frame()
        if _torch_private.branches_on_value(f):
            if f is not None and in_library(f.f_code.co_filename):
                # A library's own branch (TRL's metric logging: `x / n if n > 0 else 0.0`): taken as
                # True and listed; a branch in the user's code stops the run instead.
                self.reads[(frame_site(f), "bool (library branch)", True)] += 1
                return True
            raise ValueUnknownError(
                f"dry run: control flow at {frame_site(f)} depends on a tensor value ({t.dtype}, shape "
                f"{list(t.shape)}), which a dry run does not compute. Run this script without --dry-run, "
                "or make the branch independent of tensor values (e.g. a fixed step count)."
            )
        kind = "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"
        value = PLACEHOLDER[kind]
        self.reads[(frame_site(f), kind, value)] += 1
        return value

    def record(self) -> list:
        reads = [ValueRead(s, k, v, n) for (s, k, v), n in self.reads.most_common()]
        return reads + [ValueRead(s, c, v, n, assumed=True) for (s, c, v), n in self.given.most_common()]
