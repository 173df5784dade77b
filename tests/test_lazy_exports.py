"""The public package gives every name it exports, each imported on its first use: a process
that unpickles a source's reader (Spark's data source planners, one per query start) imports
the source's own modules, not the whole API with its sinks and Delta writer."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cutline
import cutline.sources


def test_every_exported_name_resolves_and_is_listed():
    for package in (cutline, cutline.sources):
        for name in package.__all__:
            assert getattr(package, name) is not None, name
            assert name in dir(package)
    assert cutline.JobDefinition is cutline.job.JobDefinition
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        cutline.Nope  # noqa: B018


def test_a_readers_modules_do_not_import_the_rest_of_the_api():
    code = (
        "import sys\n"
        "import cutline.sources.log, cutline.routing\n"
        "print(sorted(m for m in sys.modules if m.startswith('cutline')))\n"
        "from cutline import *\n"
        "print(JobDefinition.__module__, 'cutline.job' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded, star = out.stdout.splitlines()
    for heavy in ("cutline.job", "cutline.sinks", "cutline.operators", "cutline.sources.kafka"):
        assert f"'{heavy}'" not in loaded, loaded
    assert star == "cutline.job True"
