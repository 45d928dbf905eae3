"""One way for tests to serve an ASGI app over real HTTP: uvicorn on 127.0.0.1 at a free port,
in a daemon thread, started before the block and stopped after it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_asgi(app: Any, **config: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """Yields ("http://127.0.0.1:PORT", the server); `config`: uvicorn.Config options
    (default log_level "warning"). The thread must stop when the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, **{"log_level": "warning", **config}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "server thread did not stop"
