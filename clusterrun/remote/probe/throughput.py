"""TCP throughput from one host to another over one connection (stdlib only, Python 3.6+).

The master's probe opens a ``Sink`` on its address: it reads and discards whatever arrives and,
when the sender ends its stream, answers with the number of bytes it received. A worker's probe
``send_for`` a bounded time (or number of bytes) from its chosen interface's address, then ends
its stream and waits for that answer. The time runs from the sender's first write to the answer,
so the data still sitting in the kernels' buffers when the sender stops writing is counted when it
has arrived, not when it was written; the byte count is the receiver's.

The probe's ``OPS`` call ``sink`` and ``blast``.
"""

import json
import socket
import threading
import time

CHUNK = 1 << 20


class Sink:
    """A listener whose connections are each read to their end and answered with a count."""

    def __init__(self, addr, port=0, idle=5.0):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((addr, port))
            self.sock.listen(16)
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]
        self.idle = idle  # a sender silent this long is given up on, so no thread waits forever
        self.received = []  # bytes per finished connection, in order
        threading.Thread(target=self._accept, daemon=True, name="clusterrun-sink").start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            # One thread per connection: a stalled sender must not keep the next one waiting.
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn):
        buf = bytearray(CHUNK)
        count = 0
        try:
            conn.settimeout(self.idle)
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                count += n
            self.received.append(count)
            conn.sendall(json.dumps({"bytes": count}).encode() + b"\n")
        except OSError:
            pass  # the sender gave up or vanished; it reports that itself
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def _answer(sock, timeout):
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data.decode() or "{}")


def send_for(addr, port, src=None, *, seconds=1.0, max_bytes=1 << 31, timeout=5.0):
    """Send to a Sink for ``seconds`` or ``max_bytes``, whichever comes first; every wait is
    bounded by ``timeout``. Returns ``{"ok", "bytes", "sent", "seconds"}`` or ``{"ok": False,
    "stage", "error"}``."""
    try:
        source = (src, 0) if src else None
        sock = socket.create_connection((addr, port), timeout=timeout, source_address=source)
    except socket.timeout:
        return {"ok": False, "stage": "connect", "error": "timed out after %g s" % timeout}
    except OSError as exc:
        return {"ok": False, "stage": "connect", "error": exc.strerror or str(exc)}
    stage = "send"
    try:
        chunk = memoryview(bytes(CHUNK))
        sent = 0
        start = time.monotonic()
        stop = start + seconds
        while sent < max_bytes and time.monotonic() < stop:
            sent += sock.send(chunk[:min(CHUNK, max_bytes - sent)])
        sock.shutdown(socket.SHUT_WR)
        stage = "answer"
        reply = _answer(sock, timeout)
        took = time.monotonic() - start
    except socket.timeout:
        return {"ok": False, "stage": stage, "error": "no progress for %g s" % timeout}
    except (OSError, ValueError) as exc:
        return {"ok": False, "stage": stage, "error": getattr(exc, "strerror", None) or str(exc)}
    finally:
        sock.close()
    if "bytes" not in reply:
        return {"ok": False, "stage": "answer", "error": "the receiver closed without a count"}
    return {"ok": True, "bytes": reply["bytes"], "sent": sent, "seconds": round(took, 6)}


def sink(state, op):
    """Probe op: open (or reuse) this host's sink on ``addr``; reply with its port."""
    found = state.get("sink")
    if found is None:
        try:
            found = state["sink"] = Sink(op["addr"], op.get("port") or 0,
                                         op.get("timeout", 5.0))
        except OSError as exc:
            return {"ok": False, "error": exc.strerror or str(exc)}
    return {"ok": True, "port": found.port}


def blast(_state, op):
    """Probe op: measure this host's throughput to a sink (see ``send_for``)."""
    return send_for(op["addr"], op["port"], op.get("src"), seconds=op.get("seconds", 1.0),
                    max_bytes=op.get("bytes", 1 << 31), timeout=op.get("timeout", 5.0))
