"""The optional HTTP health endpoint of a controller process (``CTRLHUB_HEALTH_ADDR``, or
``Config.health_addr``), for kubelet probes:

- ``GET /healthz``: 200 ``ok`` while the process's event loop runs; 500 with the reason once
  it has not run for ``Config.health_stuck_after`` seconds (a handler blocking the loop);
- ``GET /readyz``: 200 ``ready`` while every controller is registered and neither draining nor
  waiting as outdated; 503 with a one-line reason otherwise.

The server runs on a thread of its own (the standard library's ``http.server``), so that it
still answers, with a 500, when the event loop is stuck.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._config import ConfigError, parse_listen_addr

__all__ = ["HealthServer"]

log = logging.getLogger("ctrlhub")


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` on ``addr`` until ``close()``. ``ready()`` returns
    ``""`` when ready, else the reason; the loop is alive while ``beat()`` is called (the
    ``ticker`` task does it)."""

    def __init__(self, addr: str, ready: Callable[[], str], stuck_after: float = 10.0) -> None:
        host, port = parse_listen_addr(addr)
        self.stuck_after = stuck_after
        self._ready = ready
        self._beat = time.monotonic()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                path = self.path.split("?", 1)[0]
                if path in ("/healthz", "/livez"):
                    code, text = server.health()
                elif path == "/readyz":
                    code, text = server.readiness()
                else:
                    code, text = 404, "not found: /healthz or /readyz"
                body = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.log(5, "health: " + format, *args)

        try:
            self._http = ThreadingHTTPServer((host, port), Handler)
        except OSError as err:
            raise ConfigError(f"cannot serve health probes on {addr}: {err.strerror or err}") from err
        self._http.daemon_threads = True
        self.port = int(self._http.server_address[1])
        """The port it listens on (useful with port 0)."""
        self._thread = threading.Thread(target=self._http.serve_forever, name="ctrlhub-health", daemon=True)
        self._thread.start()
        log.info("health probes on http://%s:%d (/healthz, /readyz)", host, self.port)

    def beat(self) -> None:
        """The event loop ran just now."""
        self._beat = time.monotonic()

    async def ticker(self, every: float = 0.5) -> None:
        """Calls ``beat`` from the event loop every ``every`` seconds, until cancelled."""
        while True:
            self.beat()
            await asyncio.sleep(every)

    def health(self) -> tuple[int, str]:
        """``/healthz``'s answer."""
        quiet = time.monotonic() - self._beat
        if quiet > self.stuck_after:
            return 500, f"event loop stuck: it has not run for {quiet:.1f} s (a handler blocking it?)"
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        """``/readyz``'s answer."""
        try:
            reason = self._ready()
        except Exception as err:  # a probe answers, whatever happens
            reason = f"readiness unknown: {err}"
        return (200, "ready") if not reason else (503, reason)

    def close(self) -> None:
        """Stops serving."""
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
