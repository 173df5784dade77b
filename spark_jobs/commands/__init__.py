"""The ``cutline`` command: its parser (main.py), what each subcommand does, and the
read-only listings."""
