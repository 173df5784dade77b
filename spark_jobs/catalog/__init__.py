"""The catalog on Delta tables: their schemas and reads (tables.py), the writer
(delta_catalog.py), the shared-file registry's rewrite (shared_files.py). The runtime opens it
here and depends only on the protocol, :class:`state.catalog.JobCatalog`."""

from __future__ import annotations

from pathlib import Path

from state.catalog import JobCatalog


def open_catalog(warehouse: str | Path, spark=None) -> JobCatalog:
    """The catalog under ``warehouse`` (its tables created if missing). Without ``spark`` it
    reads and commits through delta-rs alone; maintenance (OPTIMIZE, VACUUM) needs one."""
    from spark_jobs.catalog.delta_catalog import DeltaCatalog

    return DeltaCatalog(spark, warehouse)


def catalog_exists(warehouse: str | Path) -> bool:
    """Whether every catalog table exists under ``warehouse``."""
    from spark_jobs.catalog.delta_catalog import DeltaCatalog

    return DeltaCatalog.tables_exist(warehouse)
