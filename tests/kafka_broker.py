"""A real single-node Kafka broker (KRaft, broker and controller in one JVM) on 127.0.0.1.

Kafka's jars come from Maven Central through the Ivy jar that PySpark ships, into
``~/.cache/cutline/kafka`` (fetched once, about 50 MB). Text records are produced with Kafka's
own console producer, binary ones (Avro) with kafka-python's producer; both keyed, so a key always
lands in the same partition.
"""

from __future__ import annotations

import base64
import fcntl
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pyspark

KAFKA = ("org.apache.kafka", "kafka_2.13", "3.9.2")  # the kafka-clients version Spark 4.2 uses
SLF4J = ("org.slf4j", "slf4j-simple", "1.7.36")
CACHE = Path.home() / ".cache" / "cutline" / "kafka"


def _ivy_jar() -> Path:
    return next((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))


def fetch_jars() -> Path:
    """Resolve Kafka and a logging backend into the cache (no-op when already there; one
    process at a time: two test workers may start a broker at once)."""
    lib = CACHE / "lib"
    done = lib / ".complete"
    if done.exists():
        return lib
    lib.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "fetch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():  # not fetched by the process that held the lock before
            _fetch(lib)
            done.touch()
    return lib


def _fetch(lib: Path) -> None:
    for org, name, version in (KAFKA, SLF4J):
        subprocess.run(
            [
                "java", "-jar", str(_ivy_jar()),
                "-dependency", org, name, version,
                "-confs", "default",
                "-cache", str(CACHE / "ivy-cache"),
                "-retrieve", f"{lib}/[artifact]-[revision](-[classifier]).[ext]",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    def __init__(self, workdir: Path, partitions: int = 2) -> None:
        self.workdir = workdir
        self.partitions = partitions
        self.lib = fetch_jars()
        self.port = _free_port()
        self.controller_port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, *args: str) -> list[str]:
        return [
            "java", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
            "-cp", f"{self.lib}/*", *args,
        ]  # fmt: skip

    def start(self, timeout: float = 60) -> KafkaBroker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        props = self.workdir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.workdir / 'data'}",
                    f"num.partitions={self.partitions}",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                ]
            )
            + "\n"
        )
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(props)),
            check=True,
            capture_output=True,
            timeout=120,
        )
        log = open(self.workdir / "broker.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", str(props)), stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Kafka Server started" in (self.workdir / "broker.log").read_text(errors="replace"):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            "Kafka broker did not start:\n"
            + (self.workdir / "broker.log").read_text(errors="replace")[-3000:]
        )

    def produce(self, topic: str, records: Iterable[tuple[str, bytes]]) -> None:
        """Produce ``(key, value)`` records, keyed (one key, one partition)."""
        data = b"".join(key.encode() + b"\t" + value + b"\n" for key, value in records)
        subprocess.run(
            self._java(
                "kafka.tools.ConsoleProducer",
                "--bootstrap-server", self.bootstrap,
                "--topic", topic,
                "--property", "parse.key=true",
                "--property", "key.separator=\t",
                "--producer-property", "linger.ms=20",
            ),
            input=data,
            check=True,
            capture_output=True,
            timeout=300,
        )  # fmt: skip

    def produce_binary(self, topic: str, records: list[tuple[str, bytes]]) -> list[tuple[int, int]]:
        """Produce ``(key, value)`` records with binary values, keyed; where the broker stored
        each, ``(partition, offset)``, as its acknowledgements (acks from every replica) say."""
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", retries=0, linger_ms=20
        )
        try:
            sent = [producer.send(topic, key=k.encode(), value=v) for k, v in records]
            producer.flush(timeout=120)
            return [(m.partition, m.offset) for m in (f.get(timeout=60) for f in sent)]
        finally:
            producer.close(timeout=30)

    def records(self, topic: str) -> list[tuple[int, int, bytes]]:
        """Every record of ``topic`` as the broker stored it: ``(partition, offset, value)``,
        read from its log segments with Kafka's own ``DumpLogSegments``."""
        out = []
        for directory in sorted((self.workdir / "data").glob(f"{topic}-*")):
            partition = int(directory.name.rsplit("-", 1)[1])
            segments = ",".join(str(p) for p in sorted(directory.glob("*.log")))
            dump = subprocess.run(
                self._java(
                    "kafka.tools.DumpLogSegments", "--files", segments,
                    "--print-data-log", "--deep-iteration",
                ),
                check=True,
                capture_output=True,
                timeout=300,
            ).stdout  # fmt: skip
            for line in dump.splitlines():
                if line.startswith(b"| offset: "):
                    offset = int(line.split(b" ", 3)[2])
                    out.append((partition, offset, line.split(b" payload: ", 1)[1]))
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
