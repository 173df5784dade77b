"""A Spark standalone cluster on this machine whose workers are separate hosts as far as Cutline
can tell: each worker binds its own loopback address (127.0.0.2, 127.0.0.3, ...) and gives its
executors their own local state root and host name (``CUTLINE_LOCAL_STATE_ROOT``,
``CUTLINE_HOST``). Tests and benchmarks start one to show task-local recovery across hosts.

Master and workers are started with ``spark-class`` from the installed PySpark, each in its own
process group, and stopped with SIGKILL of those groups (executors included). Each worker's
directory (``<work_dir>/<host>``: its Spark work and temporary directories, its local state root)
is its disk. With ``private``, a worker and its executors run in a mount namespace of their own
where the other workers' disks and the ``hidden`` directories (the driver's) are empty and
read-only (:func:`private_view`): a code path that reads or writes another process's disk fails,
as it would across machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.deploy.distribution import spark_home

ROOT = Path(__file__).resolve().parents[2]  # the project: its code reaches the executors
MASTER_HOST = "127.0.0.1"


def free_port(host: str = MASTER_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def private_view(command: list[str], hidden: Sequence[Path]) -> list[str]:
    """``command`` run in a mount namespace of its own in which each of ``hidden`` (existing
    directories) is an empty read-only tmpfs: neither it nor any process it starts can read or
    write what others keep there. The process keeps its pid (``unshare`` and ``sh`` exec it).
    Needs the right to mount (root or CAP_SYS_ADMIN): see :func:`can_hide`."""
    if not hidden:
        return command
    mounts = "".join(
        f"mount -t tmpfs -o ro,size=4k cutline-hidden {shlex.quote(str(p))} && " for p in hidden
    )
    script = f'{mounts}exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command]


def can_hide() -> bool:
    """Whether this machine lets :func:`private_view` mount (containers may not)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            probe = subprocess.run(private_view(["true"], [Path(d)]), capture_output=True)
        except OSError:  # no unshare
            return False
        return probe.returncode == 0


@dataclass
class Worker:
    host: str
    local_state_root: Path
    process: subprocess.Popen

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs this worker launched (its children: another cluster's
        worker on the same address is not this one)."""
        return [
            pid
            for pid, cmd in _processes()
            if "CoarseGrainedExecutorBackend" in cmd
            and f"--hostname\x00{self.host}\x00" in cmd
            and parent_pid(pid) == self.process.pid
        ]


@dataclass
class StandaloneCluster:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager)."""

    work_dir: Path
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")
    cores_per_worker: int = 1
    memory_per_worker: str = "1g"
    master_port: int = 0
    ui_port: int = 0
    private: bool = False  # each worker sees neither the others' disks nor ``hidden``
    # options of every JVM of the cluster (master, workers, the executors they launch), given
    # to them as ``JAVA_TOOL_OPTIONS``
    java_options: str = ""
    hidden: tuple[Path, ...] = ()
    master: subprocess.Popen | None = None
    workers: dict[str, Worker] = field(default_factory=dict)

    def disk(self, host: str) -> Path:
        """Everything the worker on ``host`` and its executors keep on local disk."""
        return Path(self.work_dir) / host

    def driver_view(self, command: list[str]) -> list[str]:
        """``command`` (a driver) seeing no worker's disk, when the cluster is private."""
        if not self.private:
            return command
        return private_view(command, [self.disk(h) for h in self.hosts])

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str], hidden: Sequence[Path] = ()
    ) -> subprocess.Popen:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        return subprocess.Popen(
            private_view([str(spark_home() / "bin" / "spark-class"), *args], hidden),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "SPARK_HOME": str(spark_home()),
                **({"JAVA_TOOL_OPTIONS": self.java_options} if self.java_options else {}),
                **env,
            },
            start_new_session=True,
        )

    def start(self, timeout: float = 120) -> StandaloneCluster:
        self.work_dir = Path(self.work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.ui_port = free_port(), free_port()
        self.master = self._spawn(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
             "--port", str(self.master_port), "--webui-port", str(self.ui_port)],
            {"SPARK_LOCAL_IP": MASTER_HOST},
        )  # fmt: skip
        _wait(lambda: self._status() is not None, timeout, "the Spark master")
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        for host in self.hosts:
            (self.disk(host) / "tmp").mkdir(parents=True, exist_ok=True)
        for host in self.hosts:
            home = self.disk(host)
            root = home / "local-state"
            root.mkdir(parents=True, exist_ok=True)
            others = [self.disk(h) for h in self.hosts if h != host]
            env = {
                "SPARK_LOCAL_IP": host,
                "SPARK_WORKER_DIR": str(home / "work"),
                "SPARK_LOCAL_DIRS": str(home / "tmp"),  # its executors' scratch space
                "TMPDIR": str(home / "tmp"),
                "CUTLINE_HOST": host,
                "CUTLINE_LOCAL_STATE_ROOT": str(root),
                "PYSPARK_PYTHON": sys.executable,
                "PYTHONPATH": python_path,
            }
            proc = self._spawn(
                f"worker-{host}",
                ["org.apache.spark.deploy.worker.Worker", "--host", host,
                 "--cores", str(self.cores_per_worker), "--memory", self.memory_per_worker,
                 "--webui-port", str(free_port(host)), self.master_url],
                env,
                [*others, *self.hidden] if self.private else (),
            )  # fmt: skip
            self.workers[host] = Worker(host, root, proc)
        _wait(lambda: len(self.alive_hosts()) == len(self.hosts), timeout, "the workers")
        return self

    def _status(self) -> dict | None:
        try:
            with urllib.request.urlopen(
                f"http://{MASTER_HOST}:{self.ui_port}/json/", timeout=2
            ) as r:
                return json.loads(r.read())
        except (OSError, ValueError):  # not listening yet, or an empty page while it starts
            return None

    def alive_hosts(self) -> set[str]:
        status = self._status() or {}
        return {w["host"] for w in status.get("workers", []) if w.get("state") == "ALIVE"}

    def kill_executors(self, host: str) -> list[int]:
        """``kill -9`` of the executors on ``host`` (the worker stays). Returns their pids."""
        pids = self.workers[host].executor_pids()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def kill_host(self, host: str) -> None:
        """``kill -9`` of ``host``'s worker and executors: the host is gone, with its disk as far
        as the cluster can tell (no executor will run there again)."""
        worker = self.workers[host]
        pids = worker.executor_pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.process.wait(timeout=30)

    def stop(self) -> None:
        for proc in [w.process for w in self.workers.values()] + [self.master]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for worker in self.workers.values():  # executors started by the workers
            for pid in worker.executor_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _processes() -> list[tuple[int, str]]:
    """(pid, NUL-separated command line) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append(
                    (int(entry.name), (entry / "cmdline").read_bytes().decode(errors="replace"))
                )
            except OSError:
                continue
    return out
