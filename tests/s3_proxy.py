"""A fault-injecting HTTP proxy on loopback in front of the S3 server: every request is passed
on, answered 503 SlowDown without being passed on, passed on with its answer lost (a 503
instead: the request took effect, its writer does not know), or held for seconds before it is
passed on, as a :data:`Plan` decides. It counts requests by method, so it also measures what a
workload costs in S3 requests."""

from __future__ import annotations

import collections
import http.client
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

PASS, FAIL, LOSE, STALL = "pass", "503", "lost answer", "stall"
# (method, path with query, request number from 0) -> (fault, seconds to hold a stalled request)
Plan = Callable[[str, str, int], tuple[str, float]]

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>cutline</RequestId></Error>"
)
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "expect",
    "proxy-connection",
    "content-length",  # set again from the body read
}


def first_failing(n: int, fault: str = FAIL) -> Plan:
    """The first ``n`` requests get ``fault``; every later one passes."""
    return lambda method, path, i: (fault if i < n else PASS, 0.0)


class FaultyProxy:
    """``url`` is where clients send S3 requests; ``seen`` lists (method, path, fault) in
    arrival order; ``counts`` counts requests by method."""

    def __init__(self, upstream: str, plan: Plan) -> None:
        target = urlsplit(upstream)
        self.plan = plan
        self.seen: list[tuple[str, str, str]] = []
        self.counts: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # an answer's headers and body are two writes: with Nagle's algorithm the body
            # waits for the client's delayed ACK of the headers, 40 ms a request on loopback
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            return b"".join(chunks)
                        chunks.append(chunk)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    return response, response.read()
                finally:
                    conn.close()

            def _slow_down(self) -> None:
                self.send_response_only(503, "Slow Down")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOWDOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(_SLOWDOWN)

            def handle_any(self) -> None:
                body = self._body()
                with lock:
                    fault, hold_s = proxy.plan(self.command, self.path, len(proxy.seen))
                    proxy.seen.append((self.command, self.path, fault))
                    proxy.counts[self.command] += 1
                if fault == FAIL:
                    self._slow_down()
                    return
                if fault == STALL:
                    time.sleep(hold_s)
                response, payload = self._forward(body)
                if fault == LOSE:
                    self._slow_down()
                    return
                self.send_response_only(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                length = response.getheader("Content-Length")
                if self.command != "HEAD" or length is None:
                    length = str(len(payload))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def faults(self) -> list[tuple[str, str, str]]:
        """The requests that did not simply pass."""
        return [s for s in self.seen if s[2] != PASS]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
