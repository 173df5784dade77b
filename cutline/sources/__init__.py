"""Sources: each a definition that reads itself, behind one protocol (base.py); the local log
(log.py), Kafka (kafka.py), and a directory of files on local disk or S3 (files.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cutline._lazy import lazy_exports

if TYPE_CHECKING:
    from cutline.sources.base import PartitionPositions, Source
    from cutline.sources.dependencies import SparkDependencies
    from cutline.sources.files import FileSource
    from cutline.sources.kafka import KafkaSource
    from cutline.sources.log import LogSource

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "cutline.sources.base": ("PartitionPositions", "Source"),
        "cutline.sources.dependencies": ("SparkDependencies",),
        "cutline.sources.files": ("FileSource",),
        "cutline.sources.kafka": ("KafkaSource",),
        "cutline.sources.log": ("LogSource",),
    },
)

__all__ = [
    "FileSource",
    "KafkaSource",
    "LogSource",
    "PartitionPositions",
    "Source",
    "SparkDependencies",
]
