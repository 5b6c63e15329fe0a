"""A real uvicorn server in a background thread, on 127.0.0.1 and a port the OS picks."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class LiveServer:
    server: object
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_server(app, timeout: float = 30.0) -> LiveServer:
    import uvicorn

    # port=0: the OS gives a free port, so parallel runs never collide.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="d2s-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveServer(server, thread, f"http://127.0.0.1:{port}")
