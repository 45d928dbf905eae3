"""A fault-injecting OpenAI-compatible chat server for the real client path: it answers OpenIE
prompts with a deterministic extraction, or per passage with garbage, truncated JSON, HTTP 500,
a hang past the client timeout, or dies; plus the corpus it expects and a client for it. Its base,
`LoopbackServer`, and `send_json` serve the tests' other fake HTTP servers."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hippo_gpu.llm.backends.openai import OpenAIBackend


def _title(user: str) -> str:
    return user.split("Passage:\n", 1)[1].split("\n", 1)[0]


def _answer(user: str) -> str:
    """A deterministic 'extraction': entities = words of the title; one triple."""
    title = _title(user)
    if "Named entities:" not in user:
        return json.dumps({"named_entities": [title, title + " Town"]})
    return json.dumps({"triples": [[title, "located in", title + " Town"]]})


class LoopbackServer:
    """An HTTP server on 127.0.0.1:<ephemeral> in a daemon thread that hands every POST to
    `post(handler)` (a subclass's); `lock` guards what the subclass records across requests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                outer.post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def post(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_error(405)  # a subclass answers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def die(self) -> None:
        """Stop serving and close the listening socket: new connections are refused."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def close(self) -> None:
        self.die()


class FaultServer(LoopbackServer):
    """OpenAI-compatible server on 127.0.0.1:<ephemeral>.

    faults[title] is a list of actions consumed one per request for that passage: "garbage",
    "truncated", "500", "hang", "ok". `die_after` stops the server after that many requests.
    `delay` sleeps before every answer.
    """

    def __init__(self, *, die_after: int | None = None, delay: float = 0.0) -> None:
        self.faults: dict[str, list[str]] = {}
        self.requests: Counter[str] = Counter()  # (title, stage) -> count
        self.total = 0
        self.die_after = die_after
        self.delay = delay
        super().__init__()

    def post(self, handler: BaseHTTPRequestHandler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        title = _title(user)
        stage = "ner" if "Named entities:" not in user else "triples"
        with self.lock:
            self.total += 1
            dead = self.die_after is not None and self.total > self.die_after
            if not dead:
                self.requests[(title, stage)] += 1
            queue = self.faults.get(title, [])
            action = queue.pop(0) if queue else "ok"
        if dead:
            threading.Thread(target=self.die, daemon=True).start()
            handler.close_connection = True
            return  # no response: the client sees the connection drop
        if self.delay:
            time.sleep(self.delay)
        if action == "hang":
            time.sleep(3.0)
        if action == "500":
            send_json(handler, 500, {"error": {"message": "boom", "type": "server_error"}})
            return
        content = {"garbage": "<html>502 Bad Gateway</html> no json",
                   "truncated": '{"named_entities": ["Tru'}.get(action, _answer(user))
        send_json(handler, 200, {
            "id": "x", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
        })


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any],
          headers: dict[str, str] | None = None) -> None:
    data = json.dumps(payload).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client timed out and left


def corpus(n: int) -> list[dict[str, str]]:
    return [{"title": f"P{i:03d}", "text": f"Passage number {i}."} for i in range(n)]


def backend(url: str, **kw: Any) -> OpenAIBackend:
    from hippo_gpu.llm.backends.openai import OpenAIBackend  # the `openai` extra

    kw = {"timeout": 1.0, "max_retries": 2, "backoff": 0.01, "max_backoff": 0.05, "seed": 0,
          "concurrency": 4, **kw}
    return OpenAIBackend("fake", url, **kw)
