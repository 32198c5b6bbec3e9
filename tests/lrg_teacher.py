"""A fake OpenAI-compatible teacher for the LRGinstruction tests: a real HTTP server with rule-based
replies (a 30-word output for a [STEP-1] call, ``{"status": true}`` for a verdict), answers that can be
made to fail for prompts containing a marker, and a log of every request it got."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUTPUT = " ".join(["evidence"] * 30)


class FakeTeacher:
    def __init__(self, fail_marker: str | None = None, false_marker: str | None = None, status: int = 503):
        self.fail_marker = fail_marker  # prompts containing it get HTTP `status`
        self.false_marker = false_marker  # verdicts on prompts containing it are false
        self.status = status
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                prompt = body["messages"][-1]["content"]
                if server.fail_marker and server.fail_marker in prompt:
                    self._send(server.status, {"error": {"message": "teacher overloaded"}})
                    return
                if "response_format" in body:
                    text = json.dumps({"status": not (server.false_marker and server.false_marker in prompt)})
                else:
                    text = OUTPUT
                self._send(200, {"model": body["model"], "choices": [{"message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeTeacher:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
