"""The real executor: the script runs as it would without a recording; ops run on the simulator."""

from __future__ import annotations

from .ledger import StorageLedger
from .observers.fallbacks import RealFallbacks


class RealExecutor:
    """Nothing to install: ops run for real. The recorder feeds the ledger from the op outputs
    it sees, and reads fallbacks from the device's own count."""

    dry = False
    # Fake tensors in a real run are a compiler tracing shapes (a graph compiled on first call), not the run.
    ignores_fake_tensors = True

    def __init__(self):
        self.ledger = StorageLedger()
        self.fallbacks = RealFallbacks()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def failed(self, exc: BaseException) -> None:
        pass

    def contribute(self, recording) -> None:
        pass

    @staticmethod
    def object_collective() -> None:
        """Object collectives run as they are in a real run: their parts are plain collectives."""
        return None
