"""Resources: where jobs keep their files, how drivers are submitted to Spark, and S3.

Every field defaults to the deployment's settings (spark_jobs/deploy/settings.py: the environment,
or the file ``$CUTLINE_CONFIG``), which the ``cutline`` command reads too; the embedded default puts
everything under one home directory. A run's resource config overrides them, and a restore run
carries the failed run's config (orchestration/sensors/restore.py). Credentials for S3 never pass
through here: boto3 finds them through its standard chain.
"""

import dataclasses
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource
from pydantic import Field

from cutline.sources.dependencies import NO_DEPENDENCIES, SparkDependencies
from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.session import SubmitCommand, submit_command
from spark_jobs.deploy.settings import RuntimePaths, Settings, load_settings
from state.storage import DurableStorage, open_storage


def default_home() -> str:
    return load_settings().home


def _setting(name: str):
    """A field whose default is the deployment's setting ``name``."""
    return Field(default_factory=lambda: getattr(load_settings(), name))


class S3Resource(ConfigurableResource):
    """An S3-compatible endpoint (None: AWS, or boto3's own ``AWS_ENDPOINT_URL_S3``)."""

    endpoint_url: str | None = _setting("s3_endpoint")
    region: str | None = _setting("s3_region")

    def env(self) -> dict[str, str]:
        """Environment for a driver process (no credentials: boto3's chain supplies them)."""
        env = {}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        if self.region:
            env["AWS_DEFAULT_REGION"] = self.region
        return env

    @contextmanager
    def environment(self) -> Iterator[None]:
        """Inside, this process's S3 clients (boto3's and delta-rs's) reach this endpoint, as a
        driver's do: for ops that open storage by URL (a savepoint's target, say)."""
        saved = {name: os.environ.get(name) for name in self.env()}
        os.environ.update(self.env())
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class CutlinePaths(ConfigurableResource):
    """Where jobs keep their files, a root per role: checkpoints, the warehouse (and under it,
    unless set apart, the catalog, the output tables, the sinks' staging and the savepoints),
    local state and the input log. Each defaults to a directory under ``home``; every durable
    role may be ``s3://bucket/prefix``."""

    home: str = _setting("home")
    checkpoint_root: str | None = _setting("checkpoint_root")
    warehouse: str | None = _setting("warehouse")
    catalog_root: str | None = _setting("catalog_root")
    output_root: str | None = _setting("output_root")
    staging_root: str | None = _setting("staging_root")
    local_state_root: str | None = _setting("local_state_root")
    log_root: str | None = _setting("log_root")
    savepoint_root: str | None = _setting("savepoint_root")

    def paths(self) -> RuntimePaths:
        return Settings(
            home=self.home,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(RuntimePaths)},
        ).paths()

    def cli_args(self) -> list[str]:
        """The ``cutline run`` options that select these paths (each role's effective root)."""
        p = self.paths()
        roles = {
            "checkpoint-root": p.checkpoint_root,
            "warehouse": p.warehouse,
            "catalog-root": p.catalog,
            "output-root": p.output,
            "staging-root": p.staging,
            "local-state-root": p.local_state_root,
            "log-root": p.log_root,
            "savepoint-root": p.savepoints,
        }
        return [arg for flag, value in roles.items() for arg in (f"--{flag}", value)]

    def catalog(self) -> CatalogReader:
        """Read-only catalog access (delta-rs; no Spark)."""
        return CatalogReader(self.paths().catalog)

    def storage(self, s3: S3Resource | None = None) -> DurableStorage:
        return open_storage(
            self.paths().checkpoint_root, endpoint_url=s3.endpoint_url if s3 else None
        )


class SparkSubmit(ConfigurableResource):
    """How a driver is submitted: the Spark master (default: the settings' ``spark_master``, else
    ``local[*]``) and extra Spark conf, applied on top of the session's own."""

    master: str | None = _setting("spark_master")
    conf: dict[str, str] = Field(default_factory=dict)

    def command(
        self, app_args: list[str], *, needs: SparkDependencies = NO_DEPENDENCIES
    ) -> SubmitCommand:
        """``spark-submit`` of the driver, with what the job's sources ``needs`` on Spark's
        classpath."""
        return submit_command(app_args, self.master, needs=needs, extra=self.conf)

    def standby_command(self, app_args: list[str]) -> SubmitCommand:
        """``cutline run ... --standby`` with this master and conf: a supervisor of an active
        driver and its warm standby, each of which starts its own Spark session (no
        spark-submit; each driver puts its job's packages on Spark's classpath itself)."""
        argv = [sys.executable, "-m", "spark_jobs.commands", *app_args, "--standby"]
        if self.master:
            argv += ["--master", self.master]
        for key, value in self.conf.items():
            argv += ["--conf", f"{key}={value}"]
        return SubmitCommand(argv, {})


def run_paths(run_config: dict, default: CutlinePaths) -> CutlinePaths:
    """The paths a run was launched with: its ``cutline_paths`` resource config over
    ``default``."""
    config = run_config.get("resources", {}).get("cutline_paths", {}).get("config", {})
    return default.model_copy(update=config) if config else default
