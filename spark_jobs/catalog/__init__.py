"""The catalog on Delta tables: their schemas and reads (tables.py), the writer
(delta_catalog.py), the shared-file registry's rewrite (shared_files.py). The runtime opens it
here and depends only on the protocol, :class:`state.catalog.JobCatalog`."""

from __future__ import annotations

from pathlib import Path

from state.catalog import JobCatalog


def open_catalog(root: str | Path) -> JobCatalog:
    """The catalog under the catalog root ``root`` (a local path or an ``s3://`` URL), its
    tables created if missing. Reads and commits go through delta-rs alone: no Spark."""
    from spark_jobs.catalog.delta_catalog import DeltaCatalog

    return DeltaCatalog(root)


def catalog_exists(root: str | Path) -> bool:
    """Whether every catalog table exists under the catalog root ``root``."""
    from spark_jobs.catalog.delta_catalog import DeltaCatalog

    return DeltaCatalog.tables_exist(root)
