"""The time model as one object, for scripts that compose their own estimate (a benchmark's)."""

from __future__ import annotations

from .collective_time import collective_time
from .results import BucketEstimate
from .steps import bucket_estimate, estimate
from .time_model import call_time, core_figures, pipeline_seconds


class TimeModel:
    """The time model for one chip at one LNC (on `instance`, for its NeuronLink and EFA), for
    scripts that compose their own estimate (a benchmark's): one method per term."""

    def __init__(self, chip: str, lnc: int, instance: str | None = None, fp32_precision: str = "highest"):
        self.figures = core_figures(chip, lnc, instance)
        self.instance = instance
        self.fp32_precision = fp32_precision

    def op_seconds(self, call) -> float:
        """One call of an :class:`OpCall` or a :class:`GraphPart`."""
        return call_time(self.figures, call, self.fp32_precision)[0]

    def collective_seconds(self, kind: str, nbytes: int, group_size: int, instances: int = 1) -> float:
        """One collective over `group_size` ranks spread over `instances` instances."""
        return collective_time(self.figures, kind, nbytes, group_size, instances)[0]

    @staticmethod
    def pipeline_seconds(stage_seconds: list, microbatches: int) -> float:
        return pipeline_seconds(stage_seconds, microbatches)

    def bucket(self, recording, bucket) -> BucketEstimate:
        """Estimated seconds, terms and matmul-like FLOPs (by dtype) of one bucket of `recording`
        (a step, or a region: ``recording.region(name)``)."""
        return bucket_estimate(recording.graph_parts, bucket, self.figures, self.fp32_precision)

    def estimate(self, recordings: list):
        """The :class:`Estimate` a report shows for these ranks' recordings (step time, terms, MFU, phases)."""
        f = self.figures
        return estimate(recordings, f["chip"], f["lnc"], self.fp32_precision, self.instance)
