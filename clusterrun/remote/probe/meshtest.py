"""The all-pairs part of the preflight probe (stdlib only, 3.6+).

NCCL and Gloo connect every pair of ranks on ports the kernel picks from
``net.ipv4.ip_local_port_range`` (only the bootstrap root can be pinned). So each host listens
on an ephemeral port of its chosen address, the way NCCL's peer sockets do, and connects to
every other host's: all connections at once, non-blocking, under one deadline, so a host that
drops SYNs costs one connect timeout in all, not one per pair.
"""

import errno
import os
import selectors
import socket
import threading
import time


def close_whatever_comes(sock):
    """Accept and at once close every connection to the listening ``sock``, on a daemon thread,
    until ``sock`` is closed: a connect test needs no more of the far end."""
    threading.Thread(target=_accept_and_close, args=(sock,), daemon=True).start()


def _accept_and_close(sock):
    while True:
        try:
            conn, _peer = sock.accept()
        except OSError:
            return  # closed: the test is over
        conn.close()


class EphemeralListener:
    """A socket bound to port 0 on ``addr``: the kernel picks the port from its ephemeral range,
    as it does for NCCL. Accepts and closes connections until closed."""

    def __init__(self, addr):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((addr, 0))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(1024)
        close_whatever_comes(self.sock)


def connect_many(targets, src, timeout):
    """Open a TCP connection to every (key, addr, port) in ``targets`` from ``src`` at once.
    Returns {key: {"ok": bool, "error": str|None, "seconds": float|None}}."""
    results = {}
    selector = selectors.DefaultSelector()
    start = time.monotonic()
    for key, addr, port in targets:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if src:
                sock.bind((src, 0))
            code = sock.connect_ex((addr, port))  # type: int
        except OSError as exc:
            code = exc.errno or errno.EIO
        if code in (0, errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
            selector.register(sock, selectors.EVENT_WRITE, key)
        else:
            results[key] = {"ok": False, "error": _why(code), "seconds": None}
            sock.close()
    deadline = start + timeout
    while selector.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for item, _events in selector.select(left):
            sock = item.fileobj  # type: ignore[assignment]  # only sockets are registered
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            took = round(time.monotonic() - start, 3)
            results[item.data] = ({"ok": True, "error": None, "seconds": took} if code == 0
                                  else {"ok": False, "error": _why(code), "seconds": took})
            selector.unregister(sock)
            sock.close()
    for item in list(selector.get_map().values()):
        results[item.data] = {"ok": False, "error": "timed out after %g s" % timeout,
                              "seconds": None}
        selector.unregister(item.fileobj)
        item.fileobj.close()  # type: ignore[union-attr]
    selector.close()
    return results


def _why(code):
    try:
        return "%s (%s)" % (errno.errorcode.get(code, str(code)), os.strerror(code))
    except (ValueError, OverflowError):
        return "error %s" % code
