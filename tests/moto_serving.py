"""moto's S3 server with S3's guarantee for conditional writes: ``python moto_serving.py HOST
PORT``.

moto checks ``If-None-Match`` / ``If-Match`` and then stores the object as two steps on its
request threads, so two racing conditional PUTs of one key can both pass the check. S3 makes the
check and the write one atomic step, and the catalog's commit protocol (delta-rs creating
``_delta_log/<v>.json`` with ``If-None-Match: *``) and the checkpoint id claims rely on it. Here
every conditional write runs alone, which gives the emulator that guarantee; everything else
stays concurrent. It serves S3 alone.

moto answers a listing by reading every key of the bucket through its versioned store, sorting
all those under the prefix and only then skipping to ``start-after``: a cost in the bucket's
size (10 ms for one new log entry beside 5,000 other keys), where S3's is in the keys returned.
A Delta reader lists its log after its version on every use, so with moto's listing a catalog
commit is timed by how many unrelated keys share the bucket. Listings without a delimiter are
answered from the key names (filtered by prefix and start first, then sorted), with moto's
answer (tests/test_moto_serving.py).
"""

from __future__ import annotations

import sys
import threading

from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from moto.s3.models import FakeDeleteMarker, S3Backend
from werkzeug.serving import run_simple

_CONDITIONS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")
_MOTO_LIST = S3Backend.list_objects_v2  # moto's own listing, kept for those with a delimiter


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


def list_objects_v2(backend, bucket, prefix, delimiter, continuation_token, start_after, max_keys):
    """moto's ``S3Backend.list_objects_v2`` with the same answer, from the bucket's key names
    alone: only the names under the prefix after the start are sorted and looked up. A listing
    with a delimiter is moto's own."""
    if delimiter:
        return _MOTO_LIST(
            backend, bucket, prefix, delimiter, continuation_token, start_after, max_keys
        )
    after = (
        backend._pagination_tokens.get(continuation_token) if continuation_token else start_after
    )
    after = after or ""
    prefix = prefix or ""
    names = sorted(  # a copy of the names first: other request threads add and remove keys
        n for n in list(dict.keys(bucket.keys)) if n > after and n.startswith(prefix)
    )
    found = (bucket.keys.get(n) for n in names)
    keys = [k for k in found if k is not None and not isinstance(k, FakeDeleteMarker)]
    return backend._truncate_result(keys, max_keys)


def main(host: str, port: int) -> None:
    # S3 alone: moto's dispatcher would infer the service of every request from its host and
    # signature (about 3 ms of the server's CPU a request); this server serves S3 only
    app = create_backend_app("s3")
    S3Backend.list_objects_v2 = list_objects_v2
    run_simple(
        host,
        port,
        AtomicConditionalWrites(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
