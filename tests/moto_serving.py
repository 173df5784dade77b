"""moto's S3 server with S3's guarantee for conditional writes: ``python moto_serving.py HOST
PORT``.

moto checks ``If-None-Match`` / ``If-Match`` and then stores the object as two steps on its
request threads, so two racing conditional PUTs of one key can both pass the check. S3 makes the
check and the write one atomic step, and the catalog's commit protocol (delta-rs creating
``_delta_log/<v>.json`` with ``If-None-Match: *``) and the checkpoint id claims rely on it. Here
every conditional write runs alone, which gives the emulator that guarantee; everything else
stays concurrent. It serves S3 alone.
"""

from __future__ import annotations

import sys
import threading

from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")


class AtomicConditionalWrites:
    """WSGI middleware: a conditional write (PUT, or POST completing a multipart upload)
    checks and stores under one lock."""

    def __init__(self, app) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        conditional = environ.get("REQUEST_METHOD") in ("PUT", "POST") and any(
            environ.get(h) for h in _CONDITIONS
        )
        if not conditional:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))  # the whole answer, inside the lock


def main(host: str, port: int) -> None:
    # S3 alone: moto's dispatcher would infer the service of every request from its host and
    # signature (about 3 ms of the server's CPU a request); this server serves S3 only
    app = create_backend_app("s3")
    run_simple(
        host,
        port,
        AtomicConditionalWrites(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
