"""What SSH's connect says about a port that answers with something other than sshd (an HTTP
server, a service that closes at once) and about one that never answers, against listeners
this test opens on loopback. It used to be "no SSH answer within 5 s" for all of them, also
when the answer came at once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport.base import ConnectError, SshOptions
from clusterrun.transport.ssh import SshTransport

Serve = Callable[[socket.socket], None]


@pytest.fixture
def listener() -> Iterator[Callable[[Serve], int]]:
    """A loopback port whose every connection is handed to ``serve``."""
    servers: list[socket.socket] = []
    held: list[socket.socket] = []

    def start(serve: Serve) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def accept() -> None:
            while True:
                try:
                    conn = server.accept()[0]
                except OSError:
                    return
                held.append(conn)
                serve(conn)

        threading.Thread(target=accept, daemon=True).start()
        return int(server.getsockname()[1])

    yield start
    for sock in servers + held:
        sock.close()


def refusal(port: int, tmp_path: Path, timeout: float = 5.0) -> ConnectError:
    known = tmp_path / "known_hosts"
    known.touch()
    spec = HostSpec("127.0.0.1", "gpu1", master=True, line=1, port=port, known_hosts=str(known))
    with pytest.raises(ConnectError) as raised:
        SshTransport(spec, SshOptions(connect_timeout=timeout)).connect()
    return raised.value


def say_and_close(data: bytes) -> Serve:
    def serve(conn: socket.socket) -> None:
        conn.sendall(data)
        conn.close()
    return serve


@pytest.mark.parametrize(("sent", "shown"), [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "('HTTP/1.1 400 Bad Request')"),
    (b"junk\r\n" * 120, "('junk')"),  # paramiko gives up after 100 lines, on its own words
    (b"\xff\xfe\x00bin\n", "(b'\\xff\\xfe\\x00bin')"),
    (b"", "(closed the connection at once; an sshd over its MaxStartups does that too)"),
], ids=["http", "many-lines", "binary", "closed"])
def test_a_port_that_answers_but_not_with_ssh(listener: Callable[[Serve], int], tmp_path: Path,
                                              sent: bytes, shown: str) -> None:
    port = listener(say_and_close(sent))
    error = refusal(port, tmp_path)
    assert error.outcome is Outcome.UNREACHABLE
    assert error.message == (f"gpu1 (root@127.0.0.1:{port}): answered, but not with SSH "
                             f"{shown}: is this port sshd's? Check `port:` in the inventory "
                             "(or Port in ~/.ssh/config)."), error.message


def test_a_port_that_never_answers_is_still_a_timeout(listener: Callable[[Serve], int],
                                                      tmp_path: Path) -> None:
    port = listener(lambda _conn: None)  # accepted, held open, nothing said
    error = refusal(port, tmp_path, timeout=0.5)
    assert error.outcome is Outcome.CONNECT_TIMEOUT
    assert "no SSH answer within 0.5 s: the TCP connection opened but the SSH handshake did " \
           "not finish (connect timeout)" in error.message, error.message
    assert "answered" not in error.message
