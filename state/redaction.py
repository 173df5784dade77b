"""Secrets kept out of what Cutline prints and records (logs, events, catalog rows, Dagster
metadata, error messages): the user info of URLs (``s3://key:secret@bucket``), the values of
settings whose names say they hold a secret (``spark.hadoop.fs.s3a.secret.key=...``,
``kafka.sasl.jaas.config=...``, ``AWS_SESSION_TOKEN=...``) and AWS access key ids. Credentials
belong in the standard chains (boto3's, Hadoop's), never on a command line; this is the net
under that rule, applied where text leaves a process."""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# a setting's name that says its value is a secret
SECRET_NAME = (
    r"[\w.\-]*(?:secret|passw(?:or)?d|token|credential|access[._\-]?key|private[._\-]?key"
    r"|session[._\-]?key|api[._\-]?key|key[._\-]?password)[\w.\-]*"
)
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\",;]+)"
_SETTING = re.compile(rf"(?i)\b({SECRET_NAME})(\s*[=:]\s*|\"\s*:\s*)({_VALUE})")
_JAAS = re.compile(r"(?i)\b([\w.\-]*jaas\.config)(\s*[=:]\s*)[^\n]*")  # the rest of the line
_USER_INFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@:]+(?::[^\s@]*)?@")
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")


def redact(text: str) -> str:
    """``text`` with every secret this module knows of masked; the rest unchanged."""
    text = _USER_INFO.sub(rf"\1{MASK}@", text)
    text = _JAAS.sub(rf"\1\2{MASK}", text)
    text = _SETTING.sub(_masked_setting, text)
    return _ACCESS_KEY_ID.sub(MASK, text)


def _masked_setting(m: re.Match) -> str:
    value = m.group(3)
    quote = value[0] if value[0] in "\"'" else ""
    return f"{m.group(1)}{m.group(2)}{quote}{MASK}{quote}"


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line, each argument redacted (``--conf k=v`` pairs and URLs alike)."""
    return [redact(str(a)) for a in argv]
