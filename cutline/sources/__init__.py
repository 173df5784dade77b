"""Sources: each a definition that reads itself, behind one protocol (base.py); the local log
(log.py), Kafka (kafka.py), and a directory of files on local disk or S3 (files.py)."""

from cutline.sources.base import PartitionPositions, Source
from cutline.sources.dependencies import SparkDependencies
from cutline.sources.files import FileSource
from cutline.sources.kafka import KafkaSource
from cutline.sources.log import LogSource

__all__ = [
    "FileSource",
    "KafkaSource",
    "LogSource",
    "PartitionPositions",
    "Source",
    "SparkDependencies",
]
