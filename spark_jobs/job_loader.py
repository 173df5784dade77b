"""Where jobs come from: ``cutline run NAME`` and Dagster find a job

- named ``module:attr`` (``my_package.jobs:sessions``): the attribute is a
  :class:`~cutline.job.JobDefinition` or a function that returns one;
- registered by an installed package under the ``cutline.jobs`` entry-point group, the entry
  point's name being the job's name (``sessions = "my_package.jobs:sessions"``).

A module that does not import, an attribute that is missing or not a job, and a name nobody
registered each raise :class:`~cutline.job.JobDefinitionError` saying which.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

from cutline.job import JobDefinition, JobDefinitionError
from state.config import ConfigError

ENTRY_POINT_GROUP = "cutline.jobs"


def _build(target: object, where: str) -> JobDefinition:
    if isinstance(target, JobDefinition):
        return target
    if not callable(target):
        raise JobDefinitionError(f"{where} is a {type(target).__name__}, not a job definition")
    try:
        job = target()
    except ConfigError as e:
        raise JobDefinitionError(f"{where}: {e}") from e
    if not isinstance(job, JobDefinition):
        raise JobDefinitionError(f"{where} returned a {type(job).__name__}, not a JobDefinition")
    return job


def load_reference(reference: str) -> JobDefinition:
    """The job at ``module:attr``."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise JobDefinitionError(f"a job reference is 'module:attribute', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise JobDefinitionError(
            f"job module {module_name!r} cannot be imported: {type(e).__name__}: {e}"
        ) from e
    except Exception as e:  # the user's module raised while importing
        raise JobDefinitionError(
            f"job module {module_name!r} failed while importing: {type(e).__name__}: {e}"
        ) from e
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise JobDefinitionError(f"module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return _build(target, reference)


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_job(name: str) -> JobDefinition:
    """The job ``name``: ``module:attr``, or an installed package's entry point."""
    if ":" in name:
        return load_reference(name)
    installed = _entry_points()
    if name in installed:
        job = load_reference(installed[name])
        if job.name != name:
            raise JobDefinitionError(
                f"entry point {name!r} ({installed[name]}) builds a job named {job.name!r}"
            )
        return job
    raise JobDefinitionError(f"no job named {name!r}; registered: {job_names()}")


def job_names() -> list[str]:
    """Every job this process can find by name: those installed packages register."""
    return sorted(_entry_points())


_OWN_PACKAGES = ("spark_jobs", "state", "orchestration")


def ship_user_code(job: JobDefinition) -> list[str]:
    """Make the user's code travel with the tasks: each module that defines a stage's function
    or a transform is pickled by value (cloudpickle), so executors need not have the user's
    package installed or on their path; what it imports (pyarrow, pandas, Cutline's API) is
    still imported there by name. Returns the modules shipped."""
    from pyspark import cloudpickle

    functions = [getattr(s, "function", None) for s in job.stages]
    functions += [t.function for t in job.transforms]
    modules = {getattr(f, "__module__", None) or type(f).__module__ for f in functions if f}
    shipped = []
    for module in sorted(m for m in modules if m):
        if module.split(".")[0] in _OWN_PACKAGES or module not in sys.modules:
            continue
        cloudpickle.register_pickle_by_value(sys.modules[module])
        shipped.append(module)
    return shipped


def job_name_of(ref: str) -> str:
    """The name of the job ``ref`` names: a ``module:attr`` reference is loaded for its job's
    name; a name is taken as it is (the read-only commands list jobs no longer installed)."""
    return load_reference(ref).name if ":" in ref else ref
