"""The replayable local log, the embedded default source: ``<root>/<topic>/partition-<p>.jsonl``,
positions in bytes, read through its Python data source (spark_jobs/sources/local_log.py), which
parses each partition's byte range with Arrow and checks the key's columns itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cutline.sources.base import PositionedSource, Source
from cutline.validation import JobDefinitionError, check_name
from state.errors import BadInputError


@dataclass(frozen=True)
class LogSource(PositionedSource):
    """Topic ``topic`` of the local log. ``schema`` is a Spark DDL string of the JSON fields;
    ``max_records_per_partition`` bounds a micro-batch, which makes micro-batch boundaries
    deterministic for a given input. ``root``: the log's directory (default: the runtime's log
    root, ``--log-root`` / ``CUTLINE_LOG_ROOT``, which the runtime fills in with
    :meth:`rooted`)."""

    name: str
    topic: str
    schema: str
    max_records_per_partition: int = 10_000
    root: str | None = None

    def __post_init__(self) -> None:
        check_name("source.name", self.name)
        check_name("source.topic", self.topic)
        if self.max_records_per_partition < 1:
            raise JobDefinitionError("source.max_records_per_partition must be >= 1")

    def rooted(self, default_root: str) -> LogSource:
        """This source, reading under ``default_root`` unless it names its own root."""
        return self if self.root else dataclasses.replace(self, root=default_root)

    def _root(self) -> str:
        if not self.root:
            raise JobDefinitionError(
                f"source {self.name!r}: no log root (the runtime sets the default one)"
            )
        return self.root

    def current_partitions(self) -> tuple[list[int], int]:
        from spark_jobs.sources.local_log import topic_partitions

        parts = topic_partitions(self._root(), self.topic)
        if not parts:
            raise BadInputError(
                f"source {self.name!r}: no partitions under {self._root()}/{self.topic}"
            )
        return parts, 0

    def data_source(self, spark, reader) -> Any:
        from spark_jobs.sources.local_log import register_data_source

        register_data_source(spark)
        return reader.format("cutline_log").option("path", self._root()).option("topic", self.topic)


def with_log_root(sources: Iterable[Source], root: str) -> tuple[Source, ...]:
    """``sources``, each local log among them reading under ``root`` unless it names its own
    (the runtime's log root: ``--log-root``, ``CUTLINE_LOG_ROOT``, ``<home>/log``)."""
    return tuple(s.rooted(root) if isinstance(s, LogSource) else s for s in sources)
