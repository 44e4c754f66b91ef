"""A loopback HTTP server for the media tests: fixed bodies by path, with a handler a test may extend."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class Files(http.server.BaseHTTPRequestHandler):
    """Answers GET with `bodies[path]` (content type, bytes), else 404; a subclass handles more paths first."""

    bodies: dict[str, tuple[str, bytes]] = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path not in self.bodies:
            self.send_error(404)
            return
        kind, body = self.bodies[self.path]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def loopback_site(bodies: dict[str, tuple[str, bytes]], handler: type[Files] = Files) -> Iterator[str]:
    """The site on a free loopback port until the block ends; yields its base URL."""
    routes = type("Routes", (handler,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), routes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
