"""Wheels and package indexes for the `environment:` tests: wheels made here (metadata only, or
a one-module package), a package index on loopback that wants credentials, the real uv beside
this Python, and pip kept to the test's own sources."""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import shutil
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from clusterrun.envs import wheels

UV = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")


@pytest.fixture(autouse=True)
def only_the_inventorys_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip sees the inventory's find_links and index_url alone, not this machine's
    configuration (its index and find-links directories)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in list(os.environ):
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            monkeypatch.delenv(name)


def wheel(folder: Path, filename: str, requires_python: str = "") -> Path:
    """A wheel of ``filename``'s name, version and tags (metadata only)."""
    name, version = filename.split("-")[:2]
    folder.mkdir(exist_ok=True)
    path = folder / filename
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        meta += f"Requires-Python: {requires_python}\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        archive.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        archive.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


def wheel_of(folder: Path, dist: str, module: str, version: str = "0.1") -> Path:
    """A one-module wheel of distribution ``dist`` (``module``.WORD is the module's name)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{dist.replace('-', '_')}-{version}"
    path = folder / f"{stem}-py3-none-any.whl"
    files = {f"{module}.py": f"WORD = {module!r}\n".encode(),
             f"{stem}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{stem}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256="
              f"{base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{stem}.dist-info/RECORD",
                         "\n".join([*record, f"{stem}.dist-info/RECORD,,"]) + "\n")
    return path


class Index:
    """A package index on loopback that wants Basic credentials: ``files`` by URL path (a
    project's simple page ends with /), and the requests it got, with the Authorization header
    each carried."""

    def __init__(self, files: dict[str, bytes], user: str = "alice",
                 password: str = "s3cret-word", *, host: str = "127.0.0.1",
                 open_to_all: bool = False) -> None:
        self.files = files
        self.redirects: dict[str, str] = {}  # path -> where a 302 sends it
        self.open_to_all = open_to_all  # object storage: a signed URL, no credentials
        self.token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.seen: list[tuple[str, str]] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # uv asks before a ranged read of a wheel's metadata
                self.answer(send_body=False)

            def do_GET(self) -> None:
                self.answer(send_body=True)

            def answer(self, *, send_body: bool) -> None:
                auth = self.headers.get("Authorization", "")
                index.seen.append((self.path, auth))
                body = index.files.get(self.path)
                if auth != f"Basic {index.token}" and not index.open_to_all:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="wheels"')
                    self.end_headers()
                elif self.path in index.redirects:
                    self.send_response(302)
                    self.send_header("Location", index.redirects[self.path])
                    self.end_headers()
                elif body is None:
                    self.send_response(404)
                    self.end_headers()
                else:
                    self.send_response(200)
                    if self.path.endswith("/"):  # a project's page of a simple index
                        self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if send_body:
                        self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add_project(self, *wheels_: Path) -> None:
        """A simple (PEP 503) page listing ``wheels_`` with their sha256, and the files."""
        links = []
        for path in wheels_:
            self.files[f"/files/{path.name}"] = path.read_bytes()
            links.append(f'<a href="../../files/{path.name}#sha256={wheels.sha256_of(path)}">'
                         f"{path.name}</a>")
        name = wheels.parse_filename(wheels_[0].name)[0]
        self.files[f"/simple/{name}/"] = ("<html><body>" + "".join(links)
                                          + "</body></html>").encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
