"""The session factory's configuration: packages through Ivy, resolved once; quiet starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from spark_jobs.deploy import class_archive
from spark_jobs.deploy.class_archive import JVM_LOG_TO_STDERR
from spark_jobs.deploy.session import (
    DRIVER_JIT,
    QUIET_LOG4J,
    delta_package,
    jvm_start_output_held,
    remember_resolved_jars,
    session_conf,
)


def test_jars_resolved_once_are_passed_as_files_while_they_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLINE_IVY_DIR", str(tmp_path / "ivy"))
    monkeypatch.delenv("CUTLINE_MAVEN_REPO", raising=False)
    first = session_conf("local[2]", delta=True)
    assert first["spark.jars.packages"] == delta_package()
    assert "spark.jars" not in first

    group, artifact, version = delta_package().split(":")
    names = (f"{group}_{artifact}-{version}.jar", "io.delta_delta-storage-4.4.0.jar")
    jars = [tmp_path / "ivy" / "jars" / name for name in names]
    jars[0].parent.mkdir(parents=True)
    for jar in jars:
        jar.write_bytes(b"PK")
    # what Spark reports after resolving: file URLs of the jars it put in the Ivy cache
    remember_resolved_jars(first, ",".join(f"file://{j}" for j in jars))

    second = session_conf("local[2]", delta=True)
    assert "spark.jars.packages" not in second
    assert second["spark.jars"] == ",".join(str(j) for j in jars)
    # other packages are resolved on their own
    other = {"spark.jars.packages": delta_package() + ",org.example:other:1.0"}
    assert "spark.jars.packages" in session_conf("local[2]", extra=other, delta=True)

    jars[1].unlink()  # the cache lost a file: Ivy resolves again
    assert session_conf("local[2]", delta=True)["spark.jars.packages"] == delta_package()


def test_nothing_is_recorded_unless_every_package_resolved_to_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLINE_IVY_DIR", str(tmp_path / "ivy"))
    conf = session_conf("local[2]", delta=True)
    remember_resolved_jars(conf, f"file://{tmp_path}/missing.jar")
    assert session_conf("local[2]", delta=True)["spark.jars.packages"] == delta_package()
    other = tmp_path / "other.jar"  # a jar of its own, not the package's
    other.write_bytes(b"PK")
    remember_resolved_jars(conf, f"file://{other}")
    assert session_conf("local[2]", delta=True)["spark.jars.packages"] == delta_package()


def test_a_configuration_with_jars_of_its_own_always_resolves(tmp_path, monkeypatch):
    """spark.jars set by the caller hides the resolved jars from the started session's
    spark.jars (the Kafka connector's case), so nothing is recorded or reused for it."""
    monkeypatch.setenv("CUTLINE_IVY_DIR", str(tmp_path / "ivy"))
    own = tmp_path / "own.jar"
    own.write_bytes(b"PK")
    conf = session_conf("local[2]", extra={"spark.jars": str(own)}, delta=True)
    remember_resolved_jars(conf, f"file://{own}")
    again = session_conf("local[2]", extra={"spark.jars": str(own)}, delta=True)
    assert (again["spark.jars.packages"], again["spark.jars"]) == (delta_package(), str(own))
    assert not (tmp_path / "ivy" / "resolved").exists()


def test_quiet_sessions_log_through_cutlines_log4j_configuration(monkeypatch):
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE", "off")
    conf = session_conf("local[1]", quiet=True)
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[-1] == f"-Dlog4j2.configurationFile={QUIET_LOG4J}" and QUIET_LOG4J.is_file()
    assert "-Dlog4j2" not in session_conf()["spark.driver.extraJavaOptions"]


def test_a_local_sessions_executor_is_never_removed_for_a_pause_of_the_machine():
    """A local executor lives in the driver's JVM: a pause longer than Spark's 120 s heartbeat
    timeout must not remove it (the session could never run a task again)."""
    local = session_conf("local[2]")
    assert int(local["spark.storage.blockManagerHeartbeatTimeoutMs"]) >= 3600 * 1000
    cluster = session_conf("spark://127.0.0.1:7077")
    assert "spark.storage.blockManagerHeartbeatTimeoutMs" not in cluster


def test_drivers_use_the_class_archive_made_for_their_java_and_spark(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTLINE_CLASS_ARCHIVE", raising=False)
    monkeypatch.delenv(class_archive.DUMP_TO, raising=False)
    assert "SharedArchiveFile" not in session_conf()["spark.driver.extraJavaOptions"], "none yet"
    path = class_archive.archive_path()
    assert path is not None and path.parent == tmp_path
    path.write_bytes(b"archive")
    options = session_conf(quiet=True)["spark.driver.extraJavaOptions"].split()
    assert options == [
        "-Xshare:auto",
        f"-XX:SharedArchiveFile={path}",
        *JVM_LOG_TO_STDERR,
        *DRIVER_JIT,
        f"-Dlog4j2.configurationFile={QUIET_LOG4J}",
    ]
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE", "off")
    assert session_conf()["spark.driver.extraJavaOptions"].split() == list(DRIVER_JIT)
    # the process making the archive dumps it instead
    monkeypatch.setenv(class_archive.DUMP_TO, str(tmp_path / "new.jsa"))
    options = session_conf()["spark.driver.extraJavaOptions"].split()
    dump = f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}"
    assert options == [dump, *JVM_LOG_TO_STDERR, *DRIVER_JIT]


def test_two_environments_with_the_same_spark_never_share_an_archive(monkeypatch, tmp_path):
    """The JVM checks an archive's class path by path: a second checkout's Spark (the same jars
    in another place) gets an archive of its own instead of a warning at every start."""
    from spark_jobs.deploy import distribution

    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))
    here = class_archive.archive_path()
    other = tmp_path / "other-venv" / "pyspark"
    (other / "jars").mkdir(parents=True)
    for jar in (distribution.spark_home() / "jars").glob("*.jar"):
        (other / "jars" / jar.name).write_bytes(b"")
    monkeypatch.setattr(distribution, "spark_home", lambda: other)
    there = class_archive.archive_path()
    assert here is not None and there is not None and here != there
    assert here.parent == there.parent


def test_a_spark_installed_again_in_the_same_place_gets_an_archive_of_its_own(
    monkeypatch, tmp_path
):
    """The JVM checks each jar's size and time against the archive's: a virtualenv made again
    where it was (CI's fresh environment, ``make clean``) must not find the old archive and
    start without it, with a warning, every time."""
    from spark_jobs.deploy import distribution

    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))
    spark = tmp_path / "venv" / "pyspark"
    (spark / "jars").mkdir(parents=True)
    jar = spark / "jars" / "spark-core_2.13-4.2.0.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setattr(distribution, "spark_home", lambda: spark)
    first = class_archive.archive_path()
    assert class_archive.archive_path() == first, "the same install: the same archive"
    os.utime(jar, (jar.stat().st_atime, jar.stat().st_mtime + 60))
    assert class_archive.archive_path() != first, "installed again: another time"
    jar.write_bytes(b"PK..")
    assert class_archive.archive_path() != first


def test_archives_of_an_earlier_install_in_the_same_place_are_superseded(monkeypatch, tmp_path):
    """What ``python -m spark_jobs.commands.class_archive`` deletes once it made the archives of
    this install: those of an earlier one in the same place, never another place's."""
    from spark_jobs.deploy import distribution

    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))
    (tmp_path / "archives").mkdir()
    homes = [tmp_path / name / "pyspark" for name in ("venv", "other-venv")]
    for home in homes:
        (home / "jars").mkdir(parents=True)
        (home / "jars" / "spark-core_2.13-4.2.0.jar").write_bytes(b"PK")
    monkeypatch.setattr(distribution, "spark_home", lambda: homes[1])
    elsewhere = class_archive.archive_path()
    monkeypatch.setattr(distribution, "spark_home", lambda: homes[0])
    earlier = [class_archive.archive_path(jvm) for jvm in ("driver", "launcher")]
    jar = homes[0] / "jars" / "spark-core_2.13-4.2.0.jar"
    os.utime(jar, (jar.stat().st_atime, jar.stat().st_mtime + 60))  # installed again
    current = class_archive.archive_path()
    for path in [elsewhere, *earlier, current]:
        path.write_bytes(b"archive")
    assert class_archive.superseded_archives() == sorted(earlier)


def _child_writes(text: str) -> subprocess.Popen:
    """A process that inherits stderr, as the JVM does, and keeps it: it writes ``text`` now
    and ``later`` once its stdin closes."""
    code = f"import sys; sys.stderr.write({text!r}); sys.stderr.flush(); sys.stdin.read(); "
    code += "sys.stderr.write('later\\n')"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_the_jvms_start_up_output_is_held_and_its_later_output_passed_on(capfd):
    with jvm_start_output_held():
        child = _child_writes(":: resolution report ::\n")
        time.sleep(0.5)
        print("cutline's own line", file=sys.stderr)
    child.communicate()
    time.sleep(0.2)
    err = capfd.readouterr().err
    assert "resolution report" not in err
    assert "cutline's own line" in err and "later" in err


def test_the_held_output_is_shown_when_the_start_fails(capfd):
    with pytest.raises(RuntimeError), jvm_start_output_held():
        child = _child_writes("Error: JAVA_HOME is not set\n")
        time.sleep(0.5)
        raise RuntimeError("the session did not start")
    child.communicate()
    assert "JAVA_HOME is not set" in capfd.readouterr().err


def test_executors_are_told_where_s3_is_and_never_the_credentials():
    from spark_jobs.deploy.session import executor_env

    environ = {
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE12",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    assert executor_env(environ, {}) == {
        "spark.executorEnv.AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "spark.executorEnv.AWS_DEFAULT_REGION": "eu-west-1",
    }
    given = {"spark.executorEnv.AWS_DEFAULT_REGION": "us-east-2"}  # the user's conf wins
    assert "spark.executorEnv.AWS_DEFAULT_REGION" not in executor_env(environ, given)


def test_one_process_at_a_time_resolves_packages_into_a_cache(tmp_path):
    import fcntl

    from spark_jobs.deploy.session import one_resolution_at_a_time

    conf = {"spark.jars.packages": "g:a:1", "spark.jars.ivy": str(tmp_path / "ivy")}
    lock = tmp_path / "ivy" / "resolution.lock"
    with (
        one_resolution_at_a_time(conf),
        open(lock) as other,
        pytest.raises(BlockingIOError),  # another process's lock would wait here
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at the end
    with one_resolution_at_a_time({"spark.jars.ivy": str(tmp_path / "none")}):
        assert not (tmp_path / "none").exists(), "nothing to resolve: no lock"


def test_a_callers_driver_java_options_come_after_cutlines_instead_of_replacing_them(
    monkeypatch, tmp_path
):
    """``--conf spark.driver.extraJavaOptions=...`` (a user's JIT or GC flags) keeps the class
    archive and the quiet logging; the JVM takes the last of two conflicting options."""
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTLINE_CLASS_ARCHIVE", raising=False)
    monkeypatch.delenv(class_archive.DUMP_TO, raising=False)
    class_archive.archive_path().write_bytes(b"archive")
    own = "-XX:TieredStopAtLevel=4 -Xshare:off"
    conf = session_conf(quiet=True, extra={"spark.driver.extraJavaOptions": own})
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[-2:] == own.split()
    assert f"-Dlog4j2.configurationFile={QUIET_LOG4J}" in options and "-Xshare:auto" in options
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE", "off")
    conf = session_conf(extra={"spark.driver.extraJavaOptions": own})
    assert conf["spark.driver.extraJavaOptions"].split() == [*DRIVER_JIT, *own.split()]


STALE_ARCHIVES = """
import sys
from spark_jobs.deploy.python_env import python_environment
from spark_jobs.deploy.session import build_spark
python_environment()
print(build_spark("local[1]").range(3).count())
"""


@pytest.mark.spark
def test_stale_archives_cost_only_their_speed_up(tmp_path, monkeypatch):
    """The JVMs' warnings about archives that do not match (made for another class path) go to
    stderr, never to stdout: the launcher's is the command line spark-class runs (what precedes
    it reaches the driver's stdout), the driver's is its Python process's, where a run's events
    and a caller's parsed output go; the driver starts."""
    from spark_jobs.deploy.distribution import spark_home
    from spark_jobs.deploy.java_check import find_java

    env = {k: v for k, v in os.environ.items() if k != "SPARK_LAUNCHER_OPTS"}
    env.update(CUTLINE_CLASS_ARCHIVE_DIR=str(tmp_path), CUTLINE_CLASS_ARCHIVE="on")
    monkeypatch.setenv("CUTLINE_CLASS_ARCHIVE_DIR", str(tmp_path))
    # made over a copy of the launcher's jar: a class path no launcher or driver runs with
    jar = shutil.copy(next((spark_home() / "jars").glob("spark-launcher_*.jar")), tmp_path)
    java, _ = find_java()
    for jvm in ("launcher", "driver"):
        stale = class_archive.archive_path(jvm)
        dump = [java, f"-XX:ArchiveClassesAtExit={stale}", "-Xlog:disable", "-cp", str(jar)]
        subprocess.run([*dump, "org.apache.spark.launcher.Main"], capture_output=True, check=False)
        assert stale.is_file()
    out = subprocess.run(
        [sys.executable, "-c", STALE_ARCHIVES], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["3"]
    assert out.stderr.count("Unable to use shared archive") == 2, "both named, and stale"


STOPPED = """
import threading
from pyspark import SparkContext
from spark_jobs.deploy.session import build_spark, stop_spark

spark = build_spark("local[1]", "stop", quiet=True)
context = spark.sparkContext
total = context.accumulator(0)
context.parallelize(range(10), 2).foreach(lambda x: total.add(x))
server, jvm_context = context._accumulatorServer, context._jsc.sc()
stop_spark(spark)
stopping = [t for t in threading.enumerate() if t.name == "accumulator-stop"]
for thread in stopping:
    thread.join(30)
print(total.value, jvm_context.isStopped(), SparkContext._active_spark_context is None,
      len(stopping), any(t.is_alive() for t in stopping), server.server_shutdown)
"""


@pytest.mark.spark
def test_a_stopped_session_stops_its_context_and_its_accumulator_server_ends_beside_it():
    """``stop_spark`` stops the JVM's context and forgets the session as PySpark's own stop
    does; the accumulator server it no longer waits for ends on a thread of its own, after the
    updates of the session's jobs arrived."""
    out = subprocess.run([sys.executable, "-c", STOPPED], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1].split() == ["45", "True", "True", "1", "False", "True"]
