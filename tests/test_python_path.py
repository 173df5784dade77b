"""Spark's Python processes import PySpark from its installed, compiled package when Spark's zip
is that package's own copy, and keep Spark's order otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark

from spark_jobs.deploy.python_env import WORKER_SITE
from spark_jobs.executor.python_path import prefer_installed_pyspark

INSTALLED = Path(pyspark.__file__).parent
SITE = str(INSTALLED.parent)
LIB = INSTALLED / "python" / "lib"
ZIPS = [str(LIB / "pyspark.zip"), str(next(LIB.glob("py4j-*-src.zip")))]


def test_the_installed_packages_own_zips_go_last():
    path = [*ZIPS, "/somewhere/app", SITE]
    assert prefer_installed_pyspark(path) == ["/somewhere/app", SITE, *ZIPS]


def test_a_spark_distributions_zips_keep_their_place(tmp_path):
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    other = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert prefer_installed_pyspark([*other, SITE]) == [*other, SITE]  # another PySpark
    assert prefer_installed_pyspark([*ZIPS, "/nowhere"]) == [*ZIPS, "/nowhere"]  # none installed
    assert prefer_installed_pyspark([SITE]) == [SITE]


def test_a_process_started_as_spark_starts_its_workers_imports_the_compiled_package():
    """Spark's worker environment: its zips first on PYTHONPATH, then the directory that
    session_conf adds (spark.executorEnv.PYTHONPATH) with its sitecustomize."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*ZIPS, str(WORKER_SITE)])}
    code = "import pyspark.daemon, pyspark; print(pyspark.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == INSTALLED / "__init__.py"
    # the hook imports nothing of the runtime: where spark_jobs comes from stays the process's
    modules = "import sys; print(sorted(m for m in sys.modules if m.startswith('spark_jobs')))"
    out = subprocess.run([sys.executable, "-c", modules], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    env["PYTHONPATH"] = os.pathsep.join(ZIPS)  # without it: the zip (what Spark does)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "pyspark.zip" in out.stdout


def test_a_deployments_own_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*ZIPS, str(WORKER_SITE), str(tmp_path)])}
    code = "import os, pyspark; print(os.environ.get('THEIRS_RAN'), pyspark.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ran, origin = out.stdout.split()
    assert ran == "yes" and Path(origin) == INSTALLED / "__init__.py"
