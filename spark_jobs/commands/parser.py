"""The ``cutline`` command line: a job's name (registered by an installed package) or
``module:attr`` for every subcommand; ``--home``, ``--verbose`` and the path options before or
after the subcommand. Each subcommand names its handler in spark_jobs/commands/handlers.py
(``handler``); spark_jobs/commands/main.py calls it."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any


def _checkpoint(text: str) -> int | str:
    """A checkpoint id, or a savepoint's location (a path or URL)."""
    if text.isdigit():
        return int(text)
    if "/" in text:
        return text
    raise argparse.ArgumentTypeError(f"a checkpoint id or a savepoint's location, got {text!r}")


JOB_HELP = "a job's name (registered by an installed package), or module:attribute of your own"


def _add_global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """``--home``, ``--verbose`` and the path options, on the top parser (``default`` None) and
    on every subcommand (``default`` SUPPRESS, so a value given before the subcommand stays):
    they go before or after the subcommand."""
    parser.add_argument(
        "--home",
        default=default,
        help="put every path no flag names under this directory "
        "(default: the settings, $CUTLINE_HOME or ./.cutline)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=False if default is None else default,
        help="show Spark's and Ivy's start-up output and Spark's warnings",
    )
    for name, where in (
        ("checkpoint-root", "<home>/checkpoints; or s3://bucket/prefix"),
        ("warehouse", "<home>/warehouse; or s3://bucket/prefix"),
        ("catalog-root", "<warehouse>/catalog"),
        ("output-root", "<warehouse>/tables"),
        ("staging-root", "<warehouse>/staging"),
        ("local-state-root", "<home>/local-state"),
        ("log-root", "<home>/log"),
        ("savepoint-root", "<warehouse>/savepoints"),
    ):
        parser.add_argument(f"--{name}", default=default, help=f"default: {where}")


def _positive(kind: type) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` above zero (zero and negatives are refused, not
    ignored)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _restore_choice(text: str) -> str:
    from spark_jobs.driver.savepoints import is_location

    if text in ("latest", "none") or (text.isdigit() and int(text) > 0) or is_location(text):
        return text
    raise argparse.ArgumentTypeError(
        f"latest, none, a checkpoint id or a savepoint's location, got {text!r}"
    )


def build_parser() -> argparse.ArgumentParser:
    from cutline.job import BAD_RECORD_POLICIES
    from spark_jobs.sources.generate import FORMATS, KINDS, SCHEMAS

    description = __doc__.split(" Each ")[0].replace("``", "")  # the docstring, as plain text
    parser = argparse.ArgumentParser(prog="cutline", description=description)
    _add_global_options(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    add = functools.partial(sub.add_parser, parents=[common])
    demo = add("demo", help="run the main job (clicks_per_user) on the embedded default")
    demo.set_defaults(handler="demo")
    core = add("core-demo", help="checkpoint, crash and restore with state/ alone")
    core.set_defaults(handler="core_demo")
    run = add("run", help="run a streaming job, registered or module:attribute (one attempt)")
    run.add_argument("job", help=JOB_HELP)
    run.add_argument(
        "--restore",
        default="latest",
        type=_restore_choice,
        help="latest (default), a checkpoint id, a savepoint's location (a path or URL), or "
        "none (start over on purpose)",
    )
    run.add_argument(
        "--reset-sink",
        action="store_true",
        help="with --restore none: delete the output a start-over would append to again",
    )
    run.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="restore even if the checkpoint holds state of a stage the job no longer has "
        "(that state is dropped)",
    )
    run.add_argument("--hints", help="JSON file: executor hints {subtask: host}")
    run.add_argument("--max-batches", type=_positive(int), help="stop after N micro-batches")
    run.add_argument(
        "--idle-timeout", type=_positive(float), help="stop after S seconds without new input"
    )
    run.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop, after a final checkpoint, once a trigger finds no new input in any source "
        "(a backfill or a batch rerun of a streaming job, as Spark's AvailableNow trigger)",
    )
    run.add_argument("--master", help="Spark master (default: the settings, or local[*])")
    run.add_argument("--mode", choices=["exactly_once", "at_least_once"], help="override")
    run.add_argument("--interval-ms", type=_positive(int), help="override the checkpoint interval")
    run.add_argument(
        "--max-records-per-partition",
        type=_positive(int),
        help="override every source's admission limit per partition and micro-batch",
    )
    run.add_argument(
        "--parallelism",
        type=_positive(int),
        help="override (another than the checkpoint's rescales the state on restore)",
    )
    run.add_argument(
        "--bad-records",
        choices=BAD_RECORD_POLICIES,
        help="override: fail on a bad record (exit 2), or skip it into the dead-letter table",
    )
    run.add_argument(
        "--executor-wait-s",
        type=_positive(float),
        help="how long a restore on a cluster waits for executors on the hinted hosts (60)",
    )
    run.add_argument(
        "--standby",
        action="store_true",
        help="keep a second driver warm beside the active one, to take over when it dies "
        "(this process supervises both and starts no JVM itself)",
    )
    run.add_argument(
        "--takeovers",
        type=_positive(int),
        help="with --standby: takeovers before a death ends the run for the orchestrator's "
        "restore (10)",
    )
    run.add_argument("--as-standby", action="store_true", help=argparse.SUPPRESS)
    run.add_argument("--run-id", default="", help="orchestrator run id, recorded in the catalog")
    run.add_argument(
        "--conf",
        action="append",
        type=_spark_conf,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark configuration property of the driver's session, as spark-submit's --conf",
    )
    run.set_defaults(handler="run")
    gc = add("gc", help="retention GC of a job: subsume, delete what nothing needs")
    gc.add_argument("job", help=JOB_HELP)
    gc.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    gc.add_argument("--grace-s", type=float, help="default: the job's checkpoint timeout")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(handler="gc")
    comp = add("compact", help="ask a job to compact its RocksDB state at its next barrier")
    comp.add_argument("job", help=JOB_HELP)
    comp.add_argument("--force", action="store_true", help="every subtask, whatever its chain")
    comp.add_argument("--max-files", type=int, help="default: checkpoint.compaction_max_files")
    comp.add_argument(
        "--max-checkpoints", type=int, help="default: checkpoint.compaction_max_checkpoints"
    )
    comp.add_argument("--dry-run", action="store_true", help="measure; request nothing")
    comp.add_argument("--json", action="store_true")
    comp.set_defaults(handler="compact")
    save = add("savepoint", help="a savepoint of a job (at its next barrier if it runs)")
    save.add_argument("job", help=JOB_HELP)
    save.add_argument(
        "--target", help="the directory (path or URL) to put it in (default: the savepoint root)"
    )
    save.add_argument("--stop", action="store_true", help="stop the job with the savepoint")
    save.add_argument(
        "--timeout", type=_positive(float), default=600.0, help="seconds to wait for it (600)"
    )
    save.add_argument("--dispose", metavar="LOCATION", help="delete this savepoint instead")
    save.add_argument("--json", action="store_true")
    save.set_defaults(handler="savepoint")
    saves = add("savepoints", help="a job's savepoints, from the catalog")
    saves.add_argument("job", help=JOB_HELP)
    saves.add_argument("--json", action="store_true")
    saves.set_defaults(handler="savepoints")
    kinds = "; ".join(f"{kind}: {schema}" for kind, schema in SCHEMAS.items())
    gen = add(
        "generate",
        help="append synthetic events to the local log",
        description=f"Append synthetic records to the local log. Kinds: {kinds}. "
        "Event times are epoch ms, 10 ms apart per partition, up to 2 s out of order.",
    )
    gen.add_argument("kind", choices=KINDS, help="what to generate (the schemas above)")
    gen.add_argument(
        "--count",
        type=int,
        required=True,
        help="records to append in total, spread evenly over the partitions",
    )
    gen.add_argument(
        "--per-partition", action="store_true", help="--count is per partition, not in total"
    )
    gen.add_argument("--topic", help="topic (default: the kind)")
    gen.add_argument("--partitions", type=int, default=2, help="partitions of the topic (2)")
    gen.add_argument("--seed", type=int, default=42, help="the same seed, the same records (42)")
    gen.add_argument("--users", type=int, default=10_000, help="distinct users (10,000)")
    gen.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    gen.add_argument(
        "--format",
        choices=FORMATS,
        help="the topic's format: JSON lines (byte positions) or Arrow segments (record "
        "positions, read without parsing); default: the topic's, jsonl for a new one",
    )
    gen.set_defaults(handler="generate")
    chk = add("checkpoints", help="a job's checkpoints, from the catalog")
    chk.add_argument("job", help=JOB_HELP)
    chk.add_argument("--json", action="store_true")
    chk.set_defaults(handler="checkpoints")
    ver = add("verify", help="verify manifests and the files they name (checksums)")
    ver.add_argument("job", help=JOB_HELP)
    ver.add_argument("checkpoint_id", nargs="?", type=int)
    ver.set_defaults(handler="verify")
    state = add("state", help="a job's state in its checkpoints")
    state_sub = state.add_subparsers(dest="state_command", required=True)
    read = state_sub.add_parser(
        "read",
        parents=[common],
        help="one state (or the timers) of one stage, as a table (no Spark)",
    )
    read.add_argument("job", help=JOB_HELP)
    read.add_argument("--stage", required=True, help="the stage's uid or name")
    read.add_argument("--state", help="the state's name")
    read.add_argument(
        "--timers", action="store_true", help="the stage's registered timers instead of a state"
    )
    read.add_argument(
        "--checkpoint",
        type=_checkpoint,
        default=None,
        help="a checkpoint id (default: the latest completed), or a savepoint's location",
    )
    read.add_argument("--out", default=None, help="write it as a Delta table at this URL or path")
    read.add_argument("--limit", type=int, default=20, help="rows to print (without --out)")
    read.set_defaults(handler="state_read")
    cfg = add("config", help="the effective settings and where each came from")
    cfg.add_argument("--json", action="store_true")
    cfg.set_defaults(handler="config")
    return parser
