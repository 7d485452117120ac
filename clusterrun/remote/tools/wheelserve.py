"""The master's wheel store, served read-only to the other hosts for the length of one
`environment:` sync (stdlib only, Python 3.6+).

Request: ``{"workdir", "bind", "token"}``. It listens on ``bind`` (the master's data address) on a
fresh port the kernel picks, answers ``{"port": N}``, and serves ``GET /<sha256>`` with the file
of ``<workdir>/wheels/<sha256>/`` to requests that carry the token in ``X-Clusterrun-Token``,
until its stdin closes (the controller's end of the sync, or its death). Nothing else is
served: no listing, no path but a sha256.
"""

import hmac
import json
import os
import re
import shutil
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn

from clusterrun.remote.hostlib import hostio

_SHA_RE = re.compile(r"^/([0-9a-f]{64})$")


class Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 128  # every other host asks at once


def handler_for(store, token):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # the name http.server calls
            given = self.headers.get("X-Clusterrun-Token") or ""
            if not hmac.compare_digest(given.encode(), token.encode()):
                self.send_error(403)
                return
            match = _SHA_RE.match(self.path)
            folder = os.path.join(store, match.group(1)) if match else ""
            names = [n for n in os.listdir(folder) if n.endswith(".whl")] \
                if folder and os.path.isdir(folder) else []
            if not names:
                self.send_error(404)
                return
            path = os.path.join(folder, names[0])
            with open(path, "rb") as src:
                self.send_response(200)
                self.send_header("Content-Length", str(os.fstat(src.fileno()).st_size))
                self.end_headers()
                shutil.copyfileobj(src, self.wfile, 1 << 20)

        def log_message(self, *_args):  # stderr is the controller's; nothing to say there
            return

    return Handler


def main(stdin):
    req = json.loads(stdin.readline())
    store = os.path.join(os.path.abspath(os.path.expanduser(req["workdir"])), "wheels")
    family = socket.AF_INET6 if ":" in req["bind"] else socket.AF_INET
    Server.address_family = family
    server = Server((req["bind"], 0), handler_for(store, req["token"]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hostio.reply({"port": server.server_address[1]})
    while stdin.read(65536):  # the lifeline: EOF ends the service
        pass
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main(sys.stdin.buffer)
