"""A local HTTP file server for download tests (real sockets, real HTTP; no mocks)."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

PAYLOAD = bytes(range(256)) * 4000  # 1,024,000 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class FileServer:
    """Serves in-memory files; honours ``Range: bytes=N-`` unless ``ranges`` is off; can cut the
    connection of the next response after ``cut_after`` bytes; records every request."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.ranges = True
        self.cut_after: int | None = None
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                body = server.files.get(urlparse(self.path).path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start = 0
                if rng and server.ranges:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                chunk = body[start:]
                if server.cut_after is not None:
                    chunk, server.cut_after = chunk[: server.cut_after], None
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(chunk)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"


    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
