"""Finding this user's daemon, or starting it, without making a command wait for it.

A command that finds no daemon listening reaches its hosts directly, exactly as with
--no-session, and hands the hosts it reached to a daemon it starts behind it: when it exits
(or once it has run for HAND_OVER_AFTER seconds: a long launch, `logs -f`). The daemon then
connects those hosts itself, so the next command finds them warm. With
CLUSTERRUN_SESSION_COLD=wait a command that finds none starts it and goes through it instead.

The socket is bound here, by the command, under the start lock, and handed to the daemon as an
open descriptor: from that moment a command that connects is queued until the daemon accepts,
so two commands starting at once make one daemon, and none ever waits for a daemon's start to
learn whether one is there."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any, Optional

from clusterrun.remote.shared import frames
from clusterrun.session import paths

PREWARM = "prewarm"  # a control request: connect these hosts, answer at once
HAND_OVER_AFTER = 30.0  # seconds: a command still running by then hands its hosts over early
SEND_SECONDS = 2.0  # the most a hand-over may hold up a command's exit


class NoDaemon(Exception):
    """No daemon listens, and this command does not start one to go through it."""


def try_connect(path: str) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def open_socket() -> socket.socket:
    """A connection to this code's daemon. When none listens: NoDaemon (this command goes
    direct, see ``Cold``), or with CLUSTERRUN_SESSION_COLD=wait a daemon started now, the
    connection queued until it accepts."""
    path = str(paths.socket_path())
    sock = try_connect(path)
    if sock is not None:
        return sock
    if not paths.cold_waits():
        raise NoDaemon()
    sock = start(path)
    if sock is None:
        raise NoDaemon()
    return sock


def start(path: str) -> Optional[socket.socket]:
    """Bind ``path`` (unless another command just did), start a daemon on it, and return a
    connection to it; None when no daemon could be started (the command goes direct)."""
    with open(paths.lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for a bind only: microseconds
        sock = try_connect(path)
        if sock is not None:  # another command bound it meanwhile
            return sock
        try:
            listener = listen(path)
        except OSError:  # the folder is there and ours (paths.folder): a full disk, say
            return None
    try:
        sock = try_connect(path)  # queued now: the daemon accepts it once it serves
        spawn(listener)
    except OSError:
        if sock is not None:
            sock.close()
        sock = None
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        listener.close()  # the daemon holds its own copy: once it is gone, connects fail
    return sock


def listen(path: str) -> socket.socket:
    """The daemon's socket, mode 0600 inside its 0700 folder; a stale one (a daemon that died)
    is replaced: the caller holds the start lock, and nobody answered on it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def spawn(listener: socket.socket) -> None:
    """``python -m clusterrun.session.daemon FD``, in a session of its own, never waited for
    (it forks again at once). Its stderr goes to its log: a daemon that dies before it can log
    still leaves its traceback there."""
    with open(paths.log_path(), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clusterrun.session.daemon", str(listener.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            start_new_session=True, pass_fds=(listener.fileno(),))
    # Reaped by a thread: a command that runs on (a launch) keeps no zombie.
    threading.Thread(target=proc.wait, daemon=True, name="session-start").start()


def hand_over(hosts: list[dict[str, Any]]) -> None:
    """Ask the daemon to connect ``hosts`` (each ``{"host": fields, "options": ...}``, what a
    command's first word with a host says), starting one when none listens. Nothing is
    waited for: the request is queued on the socket."""
    path = str(paths.socket_path())
    sock = try_connect(path) or start(path)
    if sock is None:
        return
    try:
        sock.settimeout(SEND_SECONDS)
        sock.sendall(frames.encode(frames.RUN, 1, json.dumps(
            {frames.CONTROL: PREWARM, "hosts": hosts}).encode()))
    finally:
        sock.close()


class Cold:
    """The hosts a command reached directly because no daemon listened, to be handed over
    (``hand_over``) when it exits, or after HAND_OVER_AFTER seconds while it runs. Once a
    command went direct for one host it goes direct for all of them: each host stays on the
    path it began on for the command's whole life (an attached run's lifeline included)."""

    def __init__(self) -> None:
        self.direct = False
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._armed = False

    def going_direct(self) -> None:
        self.direct = True

    def reached(self, hello: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(hello)
            arm, self._armed = not self._armed, True
        if arm:
            atexit.register(self.hand_over)
            timer = threading.Timer(HAND_OVER_AFTER, self.hand_over)
            timer.daemon = True
            timer.start()

    def hand_over(self) -> None:
        """What is pending, to the daemon; never an error: the command has done its work."""
        with self._lock:
            hosts, self._pending = self._pending, []
        if hosts:
            with contextlib.suppress(Exception):
                hand_over(hosts)


COLD = Cold()  # this command's (one command per process)
