"""``make demo``: Dagster's webserver and daemon on the embedded default, with example streaming
jobs running and new input arriving.

Everything lives under one home directory (``$CUTLINE_HOME``, default ``.cutline``): the Dagster
instance in ``dagster/`` (configured from ``orchestration/instance/dagster.yaml``), checkpoints,
warehouse, local state and the input log. Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop
everything it started: the generators, the streaming runs and their drivers, the webserver and
the daemon.
"""

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_graphql import DagsterGraphQLClient

from orchestration.partitions import (
    DRIVER_PID_TAG,
    JOB_TAG,
    RESTORE_OF_TAG,
    STANDBY_PID_TAG,
    SUBMIT_PID_TAG,
    WORKER_PID_TAG,
    streaming_job_partitions,
)
from orchestration.resources import default_home
from spark_jobs.job_loader import job_names

ROOT = Path(__file__).resolve().parent.parent
INSTANCE_YAML = Path(__file__).parent / "instance" / "dagster.yaml"
INPUT = {"clicks_per_user": "clicks", "windowed_revenue": "orders"}  # jobs the demo can feed


def dagster_env(home: Path) -> dict[str, str]:
    """The environment of the Dagster processes: their instance and Cutline's home."""
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(INSTANCE_YAML, dagster_home / "dagster.yaml")
    return {**os.environ, "DAGSTER_HOME": str(dagster_home), "CUTLINE_HOME": str(home)}


class DagsterProcesses:
    """``dagster-webserver`` and ``dagster-daemon`` for ``workspace.yaml``, on 127.0.0.1."""

    def __init__(self, home: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.home, self.port = home, port
        self.env = {**dagster_env(home), **(env or {})}
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout_s: float = 180) -> "DagsterProcesses":
        bin_dir = Path(sys.executable).parent
        workspace = ["-w", str(ROOT / "workspace.yaml")]
        logs = self.home / "dagster"
        # The instance's SQLite storage is created here, once, before the webserver and the
        # daemon open it: processes creating it at the same moment can stamp its schema twice
        # (alembic: "more than one head present"), and then no process can open it.
        with instance(self.home):
            pass
        for name, argv in (
            (
                "webserver",
                [
                    bin_dir / "dagster-webserver",
                    *workspace,
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                ],
            ),
            ("daemon", [bin_dir / "dagster-daemon", "run", *workspace]),
        ):
            out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
            self.procs.append(
                subprocess.Popen(
                    [str(a) for a in argv],
                    cwd=ROOT,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Dagster process exited; see {logs}/*.log")
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"the Dagster webserver did not come up on {self.url}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> DagsterGraphQLClient:
        return DagsterGraphQLClient("127.0.0.1", port_number=self.port)

    def stop(self) -> None:
        """SIGTERM to the process groups (webserver, daemon, and the code servers and run
        workers they started), then SIGKILL to whatever of them is left."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def launch_streaming_run(
    client: DagsterGraphQLClient,
    job_name: str,
    config: dict | None = None,
    resources: dict | None = None,
) -> str:
    """Submit a run of ``streaming_job`` for one streaming job (queued: one active run per job),
    with op ``config`` and ``resources`` config (resource name -> its config)."""
    run_config: dict = {"ops": {"streaming_driver": {"config": config or {}}}}
    if resources:
        run_config["resources"] = {name: {"config": c} for name, c in resources.items()}
    return client.submit_job_execution(
        "streaming_job",
        run_config=run_config,
        tags={"dagster/partition": job_name, JOB_TAG: job_name},
    )


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop as on Ctrl-C."""


def _stop_on(signum, frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestration.demo", description=__doc__)
    parser.add_argument("--home", default=default_home())
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=2000.0, help="input records/s per job")
    parser.add_argument(
        "--jobs",
        nargs="+",
        default=["clicks_per_user"],
        choices=sorted(INPUT),
        help="streaming jobs to launch (each is a Spark driver: mind the cores)",
    )
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="run each job without a warm standby driver (a kill is then a restore run's)",
    )
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on)
    generators: list[subprocess.Popen] = []
    dagster = DagsterProcesses(home, args.port)
    client = None
    try:
        dagster.start()
        client = dagster.client()
        register_partitions(home)
        print(f"Dagster UI: {dagster.url}  (home {home})", flush=True)
        generators = [_generator(home, INPUT[job], args.rate) for job in args.jobs]
        config = {"standby": not args.no_standby}
        runs = {job: launch_streaming_run(client, job, config) for job in args.jobs}
        for job, run_id in runs.items():
            print(f"launched {job}: {dagster.url}/runs/{run_id}", flush=True)
        print(
            "Open the UI: Assets (lineage, completed_checkpoints' plots), Runs, Automation.\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        told: set[str] = set()
        while all(p.poll() is None for p in dagster.procs):
            _tell_kill_instruction(home, runs, told)
            time.sleep(2)
        return 1
    except (KeyboardInterrupt, _Stop) as e:
        print(f"stopping ({e or 'Ctrl-C'}) ...", flush=True)
        return 0
    finally:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # the cleanup is not interrupted
        _stop_all(home, dagster, client, generators)


def _generator(home: Path, kind: str, rate: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", kind,
         "--count", "20000000", "--rate", str(rate)],
        cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip


def _tell_kill_instruction(home: Path, runs: dict[str, str], told: set[str]) -> None:
    """Once a run's driver is up (and its standby warm), say how to kill it, to watch the
    standby take over or ``restore_on_failure`` restore; for a run the sensor launched to
    restore a failed one, first what it restored; after a takeover, which driver took over."""
    from spark_jobs.catalog.tables import CatalogReader
    from spark_jobs.deploy.settings import RuntimePaths

    with instance(home) as inst:
        for job in runs:
            newest = inst.get_runs(
                RunsFilter(job_name="streaming_job", tags={JOB_TAG: job}), limit=1
            )
            run = newest[0] if newest else inst.get_run_by_id(runs[job])
            runs[job] = run.run_id
            pid = run.tags.get(DRIVER_PID_TAG)
            standby = run.tags.get(STANDBY_PID_TAG)
            said = f"{run.run_id}/{pid}"
            if not pid or said in told or standby == "none":  # none: one is starting
                continue
            failed = run.tags.get(RESTORE_OF_TAG)
            earlier = any(t.startswith(f"{run.run_id}/") for t in told)
            if earlier:
                print(f"{job}: the standby took over in run {run.run_id[:8]}: driver pid {pid}")
            elif failed:  # said once its attempt recorded what it restored
                catalog = CatalogReader(RuntimePaths.under(home).catalog)
                rows = [r for r in catalog.jobs(job) if r["run_id"] == run.run_id]
                if not rows or rows[-1]["allocation"] is None:
                    continue
                print(
                    f"{job}: restored by run {run.run_id[:8]} after run {failed[:8]} failed: "
                    f"attempt {rows[-1]['attempt']} from checkpoint {rows[-1]['restored_from']}, "
                    f"driver pid {pid}",
                    flush=True,
                )
            told.add(said)
            if standby:
                supervisor = run.tags.get(SUBMIT_PID_TAG)
                print(
                    f"{job}: kill its driver to watch its standby ({standby}) take over: kill -9 "
                    f"{pid}; kill both (their supervisor) to watch the automatic restore: kill -9 "
                    f"{supervisor}",
                    flush=True,
                )
            else:
                print(f"{job}: kill its driver to watch the automatic restore: kill -9 {pid}")


def _stop_all(home: Path, dagster: DagsterProcesses, client, generators) -> None:
    """Stop everything the demo started: generators, runs (their drivers with them), Dagster."""
    for g in generators:
        g.terminate()
    runs = _active_runs(home) if dagster.procs else []
    for run_id in runs:
        with contextlib.suppress(Exception):  # best effort on the way out
            client.terminate_run(run_id)
    deadline = time.monotonic() + 30
    while runs and time.monotonic() < deadline and _active_runs(home):
        time.sleep(1)
    for pid in _drivers_of(home, runs):  # a driver whose run did not stop in time
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    dagster.stop()
    for g in generators:
        with contextlib.suppress(subprocess.TimeoutExpired):
            g.wait(timeout=10)
        if g.poll() is None:
            g.kill()


def instance(home: Path) -> DagsterInstance:
    """The demo's Dagster instance (the one its webserver and daemon use)."""
    return DagsterInstance.from_config(str(home / "dagster"))


def register_partitions(home: Path) -> None:
    """A partition per registered job now (the register_streaming_jobs sensor would add them
    on its next tick, and may add some while this does)."""
    name = streaming_job_partitions.name
    with instance(home) as inst:
        for tries in range(3):
            known = set(inst.get_dynamic_partitions(name))
            new = [n for n in job_names() if n not in known]
            if not new:
                return
            try:
                inst.add_dynamic_partitions(name, new)
                return
            except Exception:  # a key added meanwhile by the daemon's sensor: read them again
                if tries == 2:
                    raise


def _active_runs(home: Path) -> list[str]:
    with instance(home) as inst:
        runs = inst.get_runs(
            RunsFilter(
                job_name="streaming_job",
                statuses=[
                    DagsterRunStatus.STARTED,
                    DagsterRunStatus.STARTING,
                    DagsterRunStatus.QUEUED,
                    DagsterRunStatus.CANCELING,
                ],
            )
        )
    return [r.run_id for r in runs]


def _drivers_of(home: Path, run_ids: list[str]) -> list[int]:
    """The live driver processes of these runs (spark-submit or the standby supervisor, the
    driver, the standby): a pid from a run's tags counts only while it is a process its run's
    worker started (it names that worker, or a supervisor that does, in ``CUTLINE_WATCH_PID``),
    never a process that reused the pid of a driver that died earlier."""
    with instance(home) as inst:
        runs = [inst.get_run_by_id(run_id) for run_id in run_ids]
    alive = []
    for run in runs:
        tags = run.tags if run else {}
        if WORKER_PID_TAG not in tags:
            continue
        # the supervisor first: killed after the active driver, it would order a takeover
        for tag in (SUBMIT_PID_TAG, DRIVER_PID_TAG, STANDBY_PID_TAG):
            pid = tags.get(tag, "")
            if pid.isdigit() and started_by(int(pid), int(tags[WORKER_PID_TAG])):
                alive.append(int(pid))
    return alive


def started_by(pid: int, worker_pid: int) -> bool:
    """Whether process ``pid`` is alive and is a driver that run worker ``worker_pid`` started,
    itself or through a standby supervisor (each names its parent in ``CUTLINE_WATCH_PID``)."""
    for _ in range(2):  # the driver, then its supervisor
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours
            return False
        watched = [v for v in environ if v.startswith(b"CUTLINE_WATCH_PID=")]
        if not watched or not watched[0].split(b"=", 1)[1].isdigit():
            return False
        pid = int(watched[0].split(b"=", 1)[1])
        if pid == worker_pid:
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
