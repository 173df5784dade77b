"""The checkpoint coordinator's two decisions, as policy objects (Flink's
CheckpointRequestDecider and CheckpointFailureManager): whether a checkpoint may start now, and
whether failed checkpoints fail the job. Neither locks: the coordinator calls them under its
own lock, with the time injected."""

from __future__ import annotations

from state.config import CheckpointConfig


class CheckpointFailureError(RuntimeError):
    """More consecutive checkpoint failures than ``tolerable_failed_checkpoints``."""


class ListenerError(RuntimeError):
    """A checkpoint listener raised ``error`` (the ``__cause__``): the job fails with it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"checkpoint listener failed: {error!r}")
        self.__cause__ = error


class TriggerPolicy:
    """A checkpoint starts when ``interval_ms`` has passed since the last trigger,
    ``min_pause_ms`` since the last completion (not before the first trigger), and fewer than
    ``max_concurrent`` are pending."""

    def __init__(self, config: CheckpointConfig, now_ms: int) -> None:
        self.config = config
        self.last_trigger_ms: int | None = None
        self.last_completion_ms = now_ms

    def may_trigger(self, now_ms: int, pending: int) -> bool:
        cfg = self.config
        if pending >= cfg.max_concurrent:
            return False
        if self.last_trigger_ms is None:
            return True
        if now_ms - self.last_trigger_ms < cfg.interval_ms:
            return False
        return now_ms - self.last_completion_ms >= cfg.min_pause_ms

    def triggered(self, now_ms: int) -> None:
        self.last_trigger_ms = now_ms

    def completed(self, now_ms: int) -> None:
        self.last_completion_ms = now_ms


class FailurePolicy:
    """Consecutive failed checkpoints (declined, expired, not completed) beyond
    ``tolerable_failed_checkpoints`` fail the job; a completed checkpoint resets the count."""

    def __init__(self, tolerable: int) -> None:
        self.tolerable = tolerable
        self.consecutive = 0

    def failed(self, reason: str) -> CheckpointFailureError | None:
        """Count one failure; the error that fails the job, once there are too many."""
        self.consecutive += 1
        if self.consecutive <= self.tolerable:
            return None
        return CheckpointFailureError(
            f"{self.consecutive} consecutive checkpoint failures exceed "
            f"tolerable_failed_checkpoints={self.tolerable} (last: {reason})"
        )

    def succeeded(self) -> None:
        self.consecutive = 0
