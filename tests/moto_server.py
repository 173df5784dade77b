"""moto's S3 server as a subprocess on 127.0.0.1, for tests and benchmarks (conditional writes
made atomic, as S3's are: tests/moto_serving.py)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 30.0
SERVING = Path(__file__).with_name("moto_serving.py")


class MotoServerError(RuntimeError):
    """The server exited or did not answer in time; the message carries its stderr."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(port: int) -> bool:
    """Whether anything answers HTTP on the loopback port (any status counts)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        conn.close()


class MotoServer:
    """``start()`` returns once the server answers; ``endpoint`` is its URL. The caller sets
    credentials (any values) through the environment, as boto3's standard chain reads them."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> MotoServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVING), "127.0.0.1", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.port):
            exited = self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                self.stop()
                why = (
                    f"exited with code {self.process.returncode}"
                    if exited
                    else f"did not answer within {START_TIMEOUT_S:.0f} s"
                )
                stderr = self.log_path.read_text(errors="replace")[-4000:]
                raise MotoServerError(f"moto server on {self.endpoint} {why}; stderr:\n{stderr}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
