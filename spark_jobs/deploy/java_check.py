"""Check that a Java runtime new enough for Spark 4 is available, before Spark is started.

Spark's launcher (``spark-class``, which PySpark runs) uses ``$JAVA_HOME/bin/java`` when
``JAVA_HOME`` is set and ``java`` on ``PATH`` otherwise; :func:`require_java` looks in the same
place, so what it reports is the Java Spark would run. Without a usable Java, PySpark fails late
with a ``JAVA_GATEWAY_EXITED`` error that hides the cause; this check fails early and says why.

``python -m spark_jobs.deploy.java_check`` prints the version found and exits 0, or prints the
problem to
stderr and exits 1. This module must not import Spark.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

MIN_JAVA_MAJOR = 17

# `java -version` writes e.g. 'openjdk version "17.0.15" 2025-04-15' or 'java version "1.8.0_301"'
# to stderr, possibly after 'Picked up JAVA_TOOL_OPTIONS: ...' lines.
_VERSION_RE = re.compile(r'version "([^"]+)"')


class JavaMissingError(RuntimeError):
    """No Java runtime, or one older than Spark 4 needs."""


def find_java() -> tuple[str | None, str]:
    """The java executable Spark would run and where it came from; ``None`` if there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        source = f"JAVA_HOME={java_home}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, source
        return None, source
    return shutil.which("java"), "PATH"


def parse_java_version(output: str) -> tuple[str, int]:
    """The version string and major version in ``java -version`` output (``1.8.0_x`` is 8)."""
    match = _VERSION_RE.search(output)
    if not match:
        raise ValueError(f"no version in java -version output: {output.strip()[:200]!r}")
    version = match.group(1)
    parts = re.findall(r"\d+", version)
    if not parts:
        raise ValueError(f"cannot parse Java version {version!r}")
    major = int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(parts[0])
    return version, major


def _fail(found: str, min_major: int) -> JavaMissingError:
    return JavaMissingError(
        f"{found}. Cutline needs Java {min_major}+ for Spark 4. Install it (e.g. "
        f"`apt-get install openjdk-{min_major}-jre-headless` on Debian/Ubuntu) or set JAVA_HOME "
        f"to a Java {min_major}+ installation."
    )


def require_java(min_major: int = MIN_JAVA_MAJOR) -> str:
    """Version of the Java Spark would use; :class:`JavaMissingError` if none or too old."""
    java, source = find_java()
    if java is None:
        if source == "PATH":
            raise _fail(
                "No `java` found: JAVA_HOME is not set and there is no java on PATH", min_major
            )
        raise _fail(f"No executable bin/java under {source}", min_major)
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _fail(f"Could not run `{java} -version` (from {source}): {exc}", min_major) from exc
    output = (proc.stderr or "") + (proc.stdout or "")
    try:
        version, major = parse_java_version(output)
    except ValueError as exc:
        raise _fail(
            f"`{java} -version` (from {source}) exited {proc.returncode} and printed no "
            f"recognisable version: {output.strip()[:200]!r}",
            min_major,
        ) from exc
    if proc.returncode != 0:
        raise _fail(f"`{java} -version` (from {source}) exited {proc.returncode}", min_major)
    if major < min_major:
        raise _fail(f"Found Java {version} (major {major}) at {java} (from {source})", min_major)
    return version


def main() -> int:
    try:
        version = require_java()
    except JavaMissingError as exc:
        print(f"cutline: {exc}", file=sys.stderr)
        return 1
    java, source = find_java()
    print(f"Java {version} at {java} (from {source}): OK for Spark 4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
