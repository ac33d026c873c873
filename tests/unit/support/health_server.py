"""A server command that answers /health, for the launcher and replica tests."""

from __future__ import annotations

import sys
import textwrap

from serving.profiles import ServerCommand


def health_server(port: int, announce: str = "") -> ServerCommand:
    return python_command(f"""
        import http.server, os
        {announce}

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *args):
                pass

        http.server.HTTPServer(("127.0.0.1", {port}), Health).serve_forever()
    """)


def python_command(code: str) -> ServerCommand:
    return ServerCommand(argv=[sys.executable, "-c", textwrap.dedent(code)], env={})
