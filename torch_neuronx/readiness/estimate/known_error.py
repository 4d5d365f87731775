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

    @property
    def ratio(self) -> float:
        """Estimate over AWS's figure, in the figure's own unit."""
        return self.estimate / self.aws

    @property
    def time_error(self) -> float:
        """Estimated time over AWS's measured time, minus one (negative: the estimate is too fast)."""
        return self.aws / self.estimate - 1 if self.unit == "seq/s" else self.estimate / self.aws - 1


ROWS = (
    PublishedRow("BERT-Large phase-1 pre-training, trn1.32xlarge, DP=32", "training", "trn1", 3826.6, 3891.1, "seq/s"),
    PublishedRow(
        "Llama-3.1-70B pre-training, 32 x trn1.32xlarge, TP=32 x PP=8 x DP=4", "training", "trn1", 7.94, 9.857, "seq/s"
    ),
    PublishedRow("Llama-3.1-405B time to first token, trn2.48xlarge, TP=64", "prefill", "trn2", 2442.0, 2459.5, "ms"),
    PublishedRow("Llama-3.1-405B time per output token, trn2.48xlarge, TP=64", "decode", "trn2", 37.9, 42.9, "ms"),
    PublishedRow(
        "Llama-3.1-405B time to first token, trn2.48xlarge, TP=64, compiled", "prefill", "trn2", 2442.0, 2391.4, "ms"
    ),
    PublishedRow(
        "Llama-3.1-405B time per output token, trn2.48xlarge, TP=64, compiled", "decode", "trn2", 37.9, 33.0, "ms"
    ),
)

_KIND_WORDS = {"training": "training steps", "prefill": "prefills", "decode": "decode steps"}


def row(name: str) -> PublishedRow:
    """The row named `name`."""
    return next(r for r in ROWS if r.name == name)


def band(kind: str) -> str:
    """The known error of estimates of this kind of run, for a report, e.g. "training steps:
    estimated time -19% to -2% of AWS's measured (2 published rows, trn1)"."""
    rows = [r for r in ROWS if r.kind == kind]
    if not rows:
        return f"{kind}: no published figure of this kind of run; the estimate's error is unknown"
    errors = sorted(r.time_error for r in rows)
    span = f"{errors[0]:+.0%}" if len(errors) == 1 else f"{errors[0]:+.0%} to {errors[-1]:+.0%}"
    chips = ", ".join(sorted({r.chip for r in rows}))
    n = f"{len(rows)} published row{'s' if len(rows) > 1 else ''}"
    return f"{_KIND_WORDS[kind]}: estimated time {span} off AWS's measured ({n}, {chips})"


def rows_text(kind: str) -> str:
    """The rows a band rests on, with each one's error."""
    return "; ".join(f"{r.name}: {r.time_error:+.1%}" for r in ROWS if r.kind == kind)
