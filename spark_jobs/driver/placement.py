"""Where each subtask runs: allocation-preserving placement on a Spark cluster.

A subtask's working RocksDB lives on the local disk of the host that restored it, so every
micro-batch task of subtask *i* must run on that host, and a restore should run where the
previous attempt left its local copies. Spark has no per-task affinity for a shuffle's reduce
tasks, so Cutline builds the placement out of two scheduler mechanisms it does honour:

* **Placed restore.** The restore job reads an RDD made with ``SparkContext.makeRDD(seq of
  (element, hosts))``: partition *i* prefers the host that holds subtask *i*'s local copy (the
  restore's executor hints), when an executor runs there.
* **An anchor per attempt.** After the restore, a tiny RDD is shuffled with the subtask
  partitioner from map tasks placed on each subtask's host: reduce partition *i* then has all its
  map output on that host, and Spark's reduce locality makes that host its preferred location
  for as long as the attempt runs. Each micro-batch is shuffled with the same partitioner and
  unioned with the anchor (twice, so the anchor's host outvotes the batch's own reduce locality)
  into a ``PartitionerAwareUnionRDD``, whose tasks prefer the anchor's hosts.

``spark.locality.wait.node`` (session.py) makes Spark wait for a busy executor on the preferred
host rather than run the task elsewhere. A host that has no executor gives no preference, so its
subtasks run (and restore from the primary copy) wherever Spark has room, without holding back
the others. A micro-batch task that still lands on a host without the subtask's working state
fails loudly (``SubtaskStateError``) and the attempt is restored: placement is never a silent
correctness risk.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.core.rdd import RDD

ANCHOR_COPIES = 2  # anchor parents in each union: outvote the batch's own preferred hosts


def subtask_partition(subtask: int) -> int:
    """The partitioner of every subtask-keyed RDD (anchor and micro-batches share it: Spark
    unions them partition by partition only if the function object is the same)."""
    return subtask


def executor_hosts(sc) -> set[str]:
    """Hosts of the live executors, as Spark names them (the driver only in local mode)."""
    local = sc.master.startswith("local")
    summaries = sc._jsc.sc().statusStore().executorList(True)
    hosts = set()
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        if summary.id() != "driver" or local:
            hosts.add(summary.hostPort().rsplit(":", 1)[0])
    return hosts


def lost_subtasks(allocation: dict[str, str], spark_hosts: set[str]) -> dict[str, list[int]]:
    """Hosts of ``allocation`` (subtask -> host) with no live executor, and the subtasks whose
    working state they held: those subtasks cannot run until a restore moves them."""
    lost: dict[str, list[int]] = {}
    for subtask, host in sorted(allocation.items(), key=lambda kv: int(kv[0])):
        if spark_host_for(host, spark_hosts) is None:
            lost.setdefault(host, []).append(int(subtask))
    return lost


def _address(host: str) -> str | None:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def spark_host_for(host: str, spark_hosts: set[str]) -> str | None:
    """The Spark executor host that is ``host`` (same name, or same address), if any."""
    if host in spark_hosts:
        return host
    address = _address(host)
    if address is None:
        return None
    return next((h for h in sorted(spark_hosts) if _address(h) == address), None)


def preferred_hosts(
    allocation: Mapping[str, str], parallelism: int, spark_hosts: set[str]
) -> list[list[str]]:
    """Per subtask, the executor host to prefer: its allocated host if an executor runs there,
    else none (the subtask goes wherever Spark has room)."""
    out: list[list[str]] = []
    for subtask in range(parallelism):
        wanted = allocation.get(str(subtask))
        host = spark_host_for(wanted, spark_hosts) if wanted else None
        out.append([host] if host else [])
    return out


def wait_for_hosts(sc, hosts: set[str], timeout_s: float) -> set[str]:
    """Wait up to ``timeout_s`` until an executor runs on each of ``hosts`` (executors of a new
    application register some seconds after it starts). Returns the hosts still missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        live = executor_hosts(sc)
        missing = {h for h in hosts if spark_host_for(h, live) is None}
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.5)


def _placed_jrdd(sc: SparkContext, elements: Sequence[object], hosts: Sequence[Sequence[str]]):
    """A JVM RDD (of ``AnyRef``) of ``len(hosts)`` partitions: partition *i* holds
    ``elements[i]`` and prefers ``hosts[i]`` (no preference if empty)."""
    jvm = sc._jvm
    seq = jvm.PythonUtils.toSeq
    pairs = [jvm.scala.Tuple2(e, seq(list(h))) for e, h in zip(elements, hosts, strict=True)]
    return sc._jsc.sc().makeRDD(seq(pairs), _any_ref(sc))


def _any_ref(sc: SparkContext):
    return sc._jvm.scala.reflect.ClassTag.AnyRef()


def placed_rdd(sc: SparkContext, hosts: Sequence[Sequence[str]]) -> RDD[str]:
    """An RDD of ``len(hosts)`` partitions: partition *i* holds the string ``"i"`` and prefers
    ``hosts[i]`` (no preference if empty)."""
    from pyspark.core.rdd import RDD
    from pyspark.serializers import UTF8Deserializer

    jrdd = _placed_jrdd(sc, [str(i) for i in range(len(hosts))], hosts).toJavaRDD()
    return RDD(jrdd, sc, UTF8Deserializer())


def anchor_rdd(sc: SparkContext, hosts: Sequence[Sequence[str]]) -> RDD[tuple[int, None]]:
    """The attempt's anchor (see the module docstring), materialised: its shuffle output for
    subtask *i* sits on ``hosts[i]`` when given, and its items are ``(i, None)``. Built and
    shuffled in the JVM alone (the items pickled here, the partitioner the one PySpark's
    ``partitionBy(parallelism, subtask_partition)`` makes), so no Python worker runs for it.
    Keep a reference for as long as the attempt runs (Spark removes the shuffle output of an
    RDD the driver no longer references)."""
    from pyspark.core.rdd import RDD, Partitioner
    from pyspark.serializers import BatchedSerializer

    parallelism, jvm = len(hosts), sc._jvm
    pickled = sc._unbatched_serializer
    # key i reaches the JVM as an Integer, which PythonPartitioner places by its hash code: i
    items = [jvm.scala.Tuple2(i, pickled.dumps([(i, None)])) for i in range(parallelism)]
    placed, tag = _placed_jrdd(sc, items, hosts), _any_ref(sc)
    pairs = jvm.org.apache.spark.api.java.JavaPairRDD.fromRDD(placed, tag, tag)
    partitioner = jvm.PythonPartitioner(parallelism, id(subtask_partition))
    jrdd = jvm.PythonRDD.valueOfPair(pairs.partitionBy(partitioner))
    jrdd.count()
    anchor = RDD(jrdd, sc, BatchedSerializer(pickled))
    anchor.partitioner = Partitioner(parallelism, subtask_partition)
    return anchor


def pin_to_anchor(batch: RDD, anchor: RDD) -> RDD:
    """``batch`` (keyed by subtask, partitioned with :func:`subtask_partition`) in one RDD with
    the anchor, so that partition *i* runs on subtask *i*'s host."""
    return batch.context.union([batch] + [anchor] * ANCHOR_COPIES)
