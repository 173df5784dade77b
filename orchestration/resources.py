"""Resources: where jobs keep their files, how drivers are submitted to Spark, and S3.

The embedded default puts everything under one home directory (``$CUTLINE_HOME``, else
``.cutline`` in the working directory): checkpoints, warehouse (catalog and output tables),
local state and the input log. Credentials for S3 never pass through here: boto3 finds them
through its standard chain.
"""

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from spark_jobs.delta_catalog import CatalogReader
from spark_jobs.runtime import RuntimePaths
from spark_jobs.session import SubmitCommand, submit_command
from state.storage import DurableStorage, open_storage


def default_home() -> str:
    return str(Path(os.environ.get("CUTLINE_HOME", ".cutline")).resolve())


class S3Resource(ConfigurableResource):
    """An S3-compatible endpoint (None: AWS, or boto3's own ``AWS_ENDPOINT_URL_S3``)."""

    endpoint_url: str | None = None
    region: str | None = None

    def env(self) -> dict[str, str]:
        """Environment for a driver process (no credentials: boto3's chain supplies them)."""
        env = {}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        if self.region:
            env["AWS_DEFAULT_REGION"] = self.region
        return env


class CutlinePaths(ConfigurableResource):
    """Checkpoint root, warehouse, local state root and input log; each defaults to a
    directory under ``home``. The checkpoint root may be ``s3://bucket/prefix``."""

    home: str = Field(default_factory=default_home)
    checkpoint_root: str | None = None
    warehouse: str | None = None
    local_state_root: str | None = None
    log_root: str | None = None

    def paths(self) -> RuntimePaths:
        base = RuntimePaths.under(self.home)
        return RuntimePaths(
            checkpoint_root=self.checkpoint_root or base.checkpoint_root,
            warehouse=self.warehouse or base.warehouse,
            local_state_root=self.local_state_root or base.local_state_root,
            log_root=self.log_root or base.log_root,
        )

    def cli_args(self) -> list[str]:
        """The ``cutline run`` options that select these paths."""
        p = self.paths()
        return [
            "--checkpoint-root",
            p.checkpoint_root,
            "--warehouse",
            p.warehouse,
            "--local-state-root",
            p.local_state_root,
            "--log-root",
            p.log_root,
        ]

    def catalog(self) -> CatalogReader:
        """Read-only catalog access (delta-rs; no Spark)."""
        return CatalogReader(self.paths().warehouse)

    def storage(self, s3: S3Resource | None = None) -> DurableStorage:
        return open_storage(
            self.paths().checkpoint_root, endpoint_url=s3.endpoint_url if s3 else None
        )


class SparkSubmit(ConfigurableResource):
    """How a driver is submitted: the Spark master (default ``$CUTLINE_SPARK_MASTER`` or
    ``local[*]``) and extra Spark conf, applied on top of the session's own."""

    master: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)

    def command(self, app_args: list[str], *, kafka: bool = False) -> SubmitCommand:
        return submit_command(app_args, self.master, kafka=kafka, extra=self.conf)
