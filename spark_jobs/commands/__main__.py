"""``python -m spark_jobs.commands``: the ``cutline`` command."""

from spark_jobs.commands.process_exit import cli

cli()
