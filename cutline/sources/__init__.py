"""Sources: each a definition that reads itself, behind one protocol (base.py); the local log
(log.py) and Kafka (kafka.py)."""

from cutline.sources.base import PartitionPositions, Source, SparkDependencies
from cutline.sources.kafka import KafkaSource
from cutline.sources.log import LogSource

__all__ = ["KafkaSource", "LogSource", "PartitionPositions", "Source", "SparkDependencies"]
