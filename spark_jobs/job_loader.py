"""Where jobs come from: ``cutline run NAME`` and Dagster find a job

- named ``module:attr`` (``my_package.jobs:sessions``): the attribute is a
  :class:`~cutline.job.JobDefinition` or a function that returns one;
- registered by an installed package under the ``cutline.jobs`` entry-point group, the entry
  point's name being the job's name (``sessions = "my_package.jobs:sessions"``).

A module that does not import, an attribute that is missing or not a job, and a name nobody
registered each raise :class:`~cutline.job.JobDefinitionError` (exit 2) saying which, with what
was probably meant: the close matches of a mistyped name, the jobs a module does have, the
``module:attr`` form of a dotted module or of a file path. A module is looked for in the current
directory too, after everything installed (``cutline run my_package.jobs:sessions`` from the
directory holding ``my_package``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from types import ModuleType

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


def _import(module_name: str) -> ModuleType:
    """The module, found on the path or, after everything installed, in the current directory
    (as ``python -m`` finds one there)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        top = module_name.split(".")[0]
        if e.name != top or here in sys.path or not _in_directory(here, top):
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def _in_directory(directory: str, top: str) -> bool:
    return os.path.isdir(os.path.join(directory, top)) or os.path.isfile(
        os.path.join(directory, f"{top}.py")
    )


def module_jobs(module: ModuleType) -> list[str]:
    """The attributes of ``module`` that name jobs: job definitions, and its own functions
    annotated to return one (nothing is called)."""
    names = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, JobDefinition):
            names.append(name)
        elif inspect.isfunction(value) and value.__module__ == module.__name__:
            returns = inspect.signature(value).return_annotation
            if returns is JobDefinition or returns == "JobDefinition":
                names.append(name)
    return sorted(names)


def _jobs_of(module_name: str) -> str:
    """``'; it has: a, b'`` for a module that imports and names jobs, else ``''``."""
    try:
        names = module_jobs(_import(module_name))
    except Exception:
        return ""
    return f"; {module_name!r} has: {', '.join(names)}" if names else ""


def _close(name: str, known: Iterable[str]) -> str:
    """``'; did you mean 'a'?'`` when ``known`` has names close to ``name``, else ``''``."""
    matches = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""


def _not_a_name(reference: str) -> str | None:
    """What a reference that is neither a name nor ``module:attr`` should have been."""
    if reference.endswith(".py") or "/" in reference or os.sep in reference:
        dotted = reference.removesuffix(".py").replace(os.sep, "/").strip("./").replace("/", ".")
        return (
            f"{reference!r} is a file; name a job by its module and attribute: "
            f"'{dotted}:<attribute>'{_jobs_of(dotted)}"
        )
    if "." in reference:
        return (
            f"{reference!r} names a module, not a job: a job reference is 'module:attribute', "
            f"such as '{reference}:<attribute>'{_jobs_of(reference)}"
        )
    return None


def load_reference(reference: str) -> JobDefinition:
    """The job at ``module:attr``."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise JobDefinitionError(f"a job reference is 'module:attribute', got {reference!r}")
    try:
        module = _import(module_name)
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
            jobs = module_jobs(module)
            raise JobDefinitionError(
                f"module {module_name!r} has no attribute {attr!r}{_close(attr, jobs)}"
                + (f" (its jobs: {', '.join(jobs)})" if jobs else "")
            )
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
    raise JobDefinitionError(unknown_job(name, installed))


def unknown_job(name: str, known: Iterable[str]) -> str:
    """Why ``name`` names no job, with what was probably meant among ``known``."""
    return _not_a_name(name) or (
        f"no job named {name!r}{_close(name, known)} (registered: {', '.join(job_names())})"
    )


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


def job_name_of(ref: str, recorded: Callable[[], Iterable[str]] = tuple) -> str:
    """The name of the job ``ref`` names, for the read-only commands: a ``module:attr``
    reference is loaded for its job's name; a name is a registered job's or one ``recorded``
    returns (jobs in the catalog, installed or not). Anything else raises
    :class:`JobDefinitionError` with the close matches."""
    if ":" in ref:
        return load_reference(ref).name
    installed = job_names()
    if ref in installed:
        return ref
    known = [*installed, *recorded()]
    if ref in known:
        return ref
    raise JobDefinitionError(unknown_job(ref, known))
