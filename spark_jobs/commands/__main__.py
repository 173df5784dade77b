"""``python -m spark_jobs.commands``: the ``cutline`` command."""

import sys

from spark_jobs.commands.main import main

sys.exit(main())
