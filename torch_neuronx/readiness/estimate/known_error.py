"""The time model's known error: its estimates of the runs AWS publishes figures for.

Each row is a configuration AWS measured, reproduced at real size and estimated by this model
(``benchmarks/published.py``; the tests estimate each row again from its saved recording and
pin it to the value here). A report gives each estimate with the band of the rows of its kind,
so that a user reads "1.8 s per step" together with how far such estimates have been from AWS.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    """One published figure and this model's estimate of the same run."""

    name: str
    kind: str  # "training" (an optimizer step), "prefill" or "decode"
    chip: str
    aws: float
    estimate: float
    unit: str  # "seq/s" (a throughput) or "ms" (a time)
    tp: int = 1  # the tensor-parallel degree: training bands split at TP 8

    @property
    def ratio(self) -> float:
        """Estimate over AWS's figure, in the figure's own unit."""
        return self.estimate / self.aws

    @property
    def time_error(self) -> float:
        """Estimated time over AWS's measured time, minus one (negative: the estimate is too fast)."""
        return self.aws / self.estimate - 1 if self.unit == "seq/s" else self.estimate / self.aws - 1


ROWS = (
    PublishedRow("BERT-Large phase-1 pre-training, trn1.32xlarge, DP=32", "training", "trn1", 3826.6, 3630.14, "seq/s"),
    PublishedRow(
        "BERT-Large phase-2 pre-training, 16 x trn1.32xlarge, DP=512", "training", "trn1", 7507.0, 9290.1, "seq/s"
    ),
    PublishedRow(
        "Llama-3.1-70B pre-training, 32 x trn1.32xlarge, TP=32 x PP=8 x DP=4",
        "training",
        "trn1",
        7.94,
        5.913,
        "seq/s",
        32,
    ),
    PublishedRow(
        "Llama-3.1-405B time to first token, trn2.48xlarge, TP=64", "prefill", "trn2", 2442.0, 3117.34, "ms", 64
    ),
    PublishedRow("Llama-3.1-405B time per output token, trn2.48xlarge, TP=64", "decode", "trn2", 37.9, 68.81, "ms", 64),
    PublishedRow(
        "Llama-3.1-405B time to first token, trn2.48xlarge, TP=64, compiled",
        "prefill",
        "trn2",
        2442.0,
        3048.94,
        "ms",
        64,
    ),
    PublishedRow(
        "Llama-3.1-405B time per output token, trn2.48xlarge, TP=64, compiled", "decode", "trn2", 37.9, 55.59, "ms", 64
    ),
    PublishedRow(
        "Llama-3-70B time to first token, trn1.32xlarge, TP=32, compiled", "prefill", "trn1", 547.0, 379.32, "ms", 32
    ),
    PublishedRow(
        "Llama-3-70B time per output token, trn1.32xlarge, TP=32, compiled", "decode", "trn1", 26.2, 27.24, "ms", 32
    ),
    PublishedRow(
        "Llama-2-13b time to first token, trn1.32xlarge, TP=32, compiled", "prefill", "trn1", 6668.7, 1671.96, "ms", 32
    ),
    PublishedRow(
        "Llama-2-13b time per output token, trn1.32xlarge, TP=32, compiled", "decode", "trn1", 19.86, 18.92, "ms", 32
    ),
)

_KIND_WORDS = {"training": "training steps", "prefill": "prefills", "decode": "decode steps"}
WIDE_TP = 8  # training at a larger tensor-parallel degree is its own kind: its collectives decide it


def _same_kind(r: PublishedRow, kind: str, tp: int | None) -> bool:
    return r.kind == kind and (kind != "training" or tp is None or (r.tp > WIDE_TP) == (tp > WIDE_TP))


def _label(kind: str, tp: int | None) -> str:
    if kind != "training" or tp is None:
        return _KIND_WORDS.get(kind, kind)
    return f"training steps at TP {'>' if tp > WIDE_TP else '<='} {WIDE_TP}"


def row(name: str) -> PublishedRow:
    """The row named `name`."""
    return next(r for r in ROWS if r.name == name)


def _span(errors: list) -> str:
    errors = sorted(errors)
    return f"{errors[0]:+.0%}" if len(errors) == 1 else f"{errors[0]:+.0%} to {errors[-1]:+.0%}"


def band(kind: str, tp: int | None = None, rows: tuple = ROWS) -> str:
    """The known error of estimates of this kind of run (training: at tensor-parallel degree `tp`),
    for a report, e.g. "training steps at TP <= 8: estimated time -5% to +2% off AWS's measured
    (2 published rows, trn1)"."""
    same = [r for r in rows if _same_kind(r, kind, tp)]
    if not same:
        return f"{_label(kind, tp)}: no published figure of this kind of run; the estimate's error is unknown"
    chips = ", ".join(sorted({r.chip for r in same}))
    n = f"{len(same)} published row{'s' if len(same) > 1 else ''}"
    return f"{_label(kind, tp)}: estimated time {_span([r.time_error for r in same])} off AWS's measured ({n}, {chips})"


def rows_text(kind: str, tp: int | None = None) -> str:
    """The rows a band rests on, with each one's error."""
    return "; ".join(f"{r.name}: {r.time_error:+.1%}" for r in ROWS if _same_kind(r, kind, tp))


def leave_one_out(rows: tuple = ROWS) -> list:
    """For each row, the band the other rows of its kind give, and whether its own error is in it:
    [(row, (low, high) or None, inside)], None where no other row is of its kind."""
    out = []
    for r in rows:
        others = [o.time_error for o in rows if o is not r and _same_kind(o, r.kind, r.tp)]
        span = (min(others), max(others)) if others else None
        out.append((r, span, span is not None and span[0] <= r.time_error <= span[1]))
    return out


def mean_absolute_error(rows: tuple = ROWS) -> float:
    """The mean over the rows of |estimated time / AWS's measured time - 1|."""
    return sum(abs(r.time_error) for r in rows) / len(rows)
