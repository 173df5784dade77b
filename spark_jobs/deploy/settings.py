"""One configuration for every process of a deployment.

The ``cutline`` command, the Dagster resources (and so the streaming runs, the sensors, the
schedules and the asset checks, which all take their paths from the resources) and the drivers
they launch read their settings here, so that no two of them can disagree about where a job's
checkpoints, catalog and output live. Precedence, highest first:

1. an explicit value: a ``cutline`` flag, or a Dagster resource's config;
2. the environment (``CUTLINE_HOME``, ``CUTLINE_CHECKPOINT_ROOT``, ``CUTLINE_WAREHOUSE``,
   ``CUTLINE_CATALOG_ROOT``, ``CUTLINE_OUTPUT_ROOT``, ``CUTLINE_STAGING_ROOT``,
   ``CUTLINE_LOCAL_STATE_ROOT``, ``CUTLINE_LOG_ROOT``, ``CUTLINE_SAVEPOINT_ROOT``,
   ``CUTLINE_SPARK_MASTER``, and boto3's own ``AWS_ENDPOINT_URL_S3`` and ``AWS_DEFAULT_REGION``);
3. the TOML file named by ``CUTLINE_CONFIG`` (the same names in lower case without
   ``CUTLINE_``: ``home``, ``checkpoint_root``, ``warehouse``, ..., ``s3_endpoint``,
   ``s3_region``);
4. the embedded default: everything under the home directory (default ``./.cutline``).

Each durable role has its own URL (a local path, ``file:///abs`` or ``s3://bucket/prefix``):
the checkpoint root; the catalog, the output tables, the sinks' staging and the savepoints,
which default to ``catalog``, ``tables``, ``staging`` and ``savepoints`` under the warehouse.
Only the local state root and the input log are an executor's or the driver's own disk.

Credentials are never settings: boto3 finds them through its standard chain.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.errors import ConfigurationError
from state.storage.tables import join_url

CONFIG_ENV = "CUTLINE_CONFIG"
_ENV = {
    "home": "CUTLINE_HOME",
    "checkpoint_root": "CUTLINE_CHECKPOINT_ROOT",
    "warehouse": "CUTLINE_WAREHOUSE",
    "catalog_root": "CUTLINE_CATALOG_ROOT",
    "output_root": "CUTLINE_OUTPUT_ROOT",
    "staging_root": "CUTLINE_STAGING_ROOT",
    "local_state_root": "CUTLINE_LOCAL_STATE_ROOT",
    "log_root": "CUTLINE_LOG_ROOT",
    "savepoint_root": "CUTLINE_SAVEPOINT_ROOT",
    "spark_master": "CUTLINE_SPARK_MASTER",
    "s3_endpoint": "AWS_ENDPOINT_URL_S3",
    "s3_region": "AWS_DEFAULT_REGION",
}


# the roles under the warehouse unless set: (RuntimePaths field, directory under the warehouse)
WAREHOUSE_ROLES = (
    ("catalog_root", "catalog"),
    ("output_root", "tables"),
    ("staging_root", "staging"),
    ("savepoint_root", "savepoints"),
)


@dataclass(frozen=True)
class RuntimePaths:
    """Where a job keeps its checkpoints, catalog, output and staged output, local state and
    input log. A role left None lives under the warehouse (:data:`WAREHOUSE_ROLES`); read the
    effective roots through :attr:`catalog`, :attr:`output` and :attr:`staging`."""

    checkpoint_root: str
    warehouse: str
    local_state_root: str
    log_root: str
    catalog_root: str | None = None
    output_root: str | None = None
    staging_root: str | None = None
    savepoint_root: str | None = None

    def _role(self, field_name: str) -> str:
        under = dict(WAREHOUSE_ROLES)[field_name]
        return getattr(self, field_name) or join_url(self.warehouse, under)

    @property
    def catalog(self) -> str:
        """The catalog tables' root."""
        return self._role("catalog_root")

    @property
    def output(self) -> str:
        """The output tables' root."""
        return self._role("output_root")

    @property
    def staging(self) -> str:
        """Where two-phase sinks stage epochs before their commit."""
        return self._role("staging_root")

    @property
    def savepoints(self) -> str:
        """Where savepoints go when a request names no target."""
        return self._role("savepoint_root")

    @classmethod
    def under(cls, home: str | Path) -> RuntimePaths:
        home = Path(home).resolve()
        return cls(
            checkpoint_root=str(home / "checkpoints"),
            warehouse=str(home / "warehouse"),
            local_state_root=str(home / "local-state"),
            log_root=str(home / "log"),
        )


@dataclass(frozen=True)
class Settings:
    """A deployment's settings; a path left ``None`` lives under ``home``."""

    home: str
    checkpoint_root: str | None = None
    warehouse: str | None = None
    catalog_root: str | None = None
    output_root: str | None = None
    staging_root: str | None = None
    local_state_root: str | None = None
    log_root: str | None = None
    savepoint_root: str | None = None
    spark_master: str | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None

    def paths(self) -> RuntimePaths:
        base = RuntimePaths.under(self.home)
        return RuntimePaths(
            **{
                f.name: getattr(self, f.name) or getattr(base, f.name)
                for f in dataclasses.fields(RuntimePaths)
            }
        )

    def at_home(self, home: str | Path) -> Settings:
        """These settings with another home, under which every path then lives."""
        cleared = {f.name: None for f in dataclasses.fields(RuntimePaths)}
        return dataclasses.replace(self, home=str(Path(home).resolve()), **cleared)


# the roles a driver checks before it starts anything: (label, RuntimePaths field)
DRIVER_ROLES = (
    ("checkpoint root", "checkpoint_root"),
    ("catalog", "catalog"),
    ("output", "output"),
    ("staging", "staging"),
)


def check_roles(paths: RuntimePaths, roles=DRIVER_ROLES) -> None:
    """Fail with a :class:`ConfigurationError` naming the role when its storage refuses this
    process (a missing bucket or directory, denied access, missing or wrong credentials): a
    restart with the same configuration could not help. Transient errors pass: the run's own
    retries meet them."""
    from concurrent.futures import ThreadPoolExecutor

    from state.redaction import redact
    from state.storage import AccessError, open_storage

    def probe(url: str) -> AccessError | None:
        try:
            open_storage(url).probe()
        except AccessError as e:
            return e
        return None

    urls = [getattr(paths, field_name) for _, field_name in roles]
    with ThreadPoolExecutor(len(urls), thread_name_prefix="cutline-probe") as pool:
        refusals = list(pool.map(probe, urls))  # one round trip for all, not one each
    for (label, _), url, refused in zip(roles, urls, refusals, strict=True):
        if refused is not None:
            raise ConfigurationError(f"{label} {redact(url)}: {redact(str(refused))}") from refused


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of this process (see the module docstring for where they come from)."""
    values = {name: s.value for name, s in _sourced(environ).items()}
    home = Path(values.pop("home", ".cutline")).resolve()
    return Settings(home=str(home), **values)


# the settings that reach S3 clients (boto3, delta-rs, the executors) through the environment
S3_VARIABLES = {name: _ENV[name] for name in ("s3_endpoint", "s3_region")}
_FROM_FILE: set[str] = set()  # variables s3_environment wrote: their source stays the file


def s3_environment() -> None:
    """Put the S3 endpoint and region the settings file names into this process's environment,
    where every S3 client of the process and of its executors reads them (a variable already
    set wins, as in :func:`load_settings`). The ``cutline`` command calls it before any thread
    starts (spark_jobs/deploy/python_env.py)."""
    from spark_jobs.deploy.python_env import set_environment

    settings = load_settings()
    values = {
        var: value
        for name, var in S3_VARIABLES.items()
        if (value := getattr(settings, name)) and var not in os.environ
    }
    set_environment(values)
    _FROM_FILE.update(values)


@dataclass(frozen=True)
class Setting:
    """One effective setting of this process and where its value came from."""

    name: str
    value: str | None  # None: not set (boto3's chain, Spark's default)
    source: str  # "flag --x", "environment $X", "file <path>", "default ..."


def explain_settings(
    flags: Mapping[str, str | None] | None = None, environ: Mapping[str, str] | None = None
) -> list[Setting]:
    """Every setting's effective value and its source, in the module docstring's precedence;
    ``flags``: values given on the command line, by setting name."""
    found = _sourced(environ)
    flags = flags or {}
    replaced: dict[str, Setting] = {}  # what --home set aside: said beside what took its place
    if flags.get("home"):  # as Settings.at_home: every path no flag names lives under it
        for f in dataclasses.fields(RuntimePaths):
            if f.name in found:
                replaced[f.name] = found.pop(f.name)
    for name, value in flags.items():
        if value:
            found[name] = Setting(name, value, f"flag --{name.replace('_', '-')}")
    home = found.get("home") or Setting("home", ".cutline", "default")
    home = dataclasses.replace(home, value=str(Path(home.value or ".cutline").resolve()))
    under = RuntimePaths.under(home.value)
    defaults = {f.name: getattr(under, f.name) for f in dataclasses.fields(RuntimePaths)}
    defaults["spark_master"] = "local[*]"
    warehouse = found["warehouse"].value if "warehouse" in found else defaults["warehouse"]
    derived = {name: join_url(warehouse, under) for name, under in WAREHOUSE_ROLES}
    out = [home]
    for name in _ENV:
        if name == "home":
            continue
        if name in found:
            setting = found[name]
        elif name in derived:
            setting = Setting(name, derived[name], "default, under warehouse")
        elif name in defaults:
            where = "default, under home" if name != "spark_master" else "default"
            setting = Setting(name, defaults[name], where)
        else:
            setting = Setting(name, None, "not set")
        if name in replaced and not flags.get(name):
            aside = replaced[name]
            setting = dataclasses.replace(
                setting, source=f"{setting.source}; --home wins over {aside.value} ({aside.source})"
            )
        out.append(setting)
    return out


def _sourced(environ: Mapping[str, str] | None) -> dict[str, Setting]:
    """The settings the environment and the file give, each with its source."""
    env = os.environ if environ is None else environ
    found: dict[str, Setting] = {}
    config = env.get(CONFIG_ENV)
    if config:
        for name, value in _read_file(Path(config)).items():
            found[name] = Setting(name, value, f"file {config} (${CONFIG_ENV})")
    for name, var in _ENV.items():
        if env.get(var) and not (environ is None and var in _FROM_FILE):
            found[name] = Setting(name, env[var], f"environment ${var}")
    return found


def _read_file(path: Path) -> dict[str, str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigurationError(f"{CONFIG_ENV}={path}: cannot read it ({e})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigurationError(f"{CONFIG_ENV}={path}: not valid TOML ({e})") from e
    unknown = sorted(set(doc) - set(_ENV))
    if unknown:
        raise ConfigurationError(
            f"{CONFIG_ENV}={path}: unknown settings {unknown} (known: {sorted(_ENV)})"
        )
    bad = sorted(k for k, v in doc.items() if not isinstance(v, str) or not v)
    if bad:
        raise ConfigurationError(f"{CONFIG_ENV}={path}: settings {bad} must be non-empty strings")
    return dict(doc)
