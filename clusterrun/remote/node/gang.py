"""Gang semantics for detached runs, with no controller (stdlib only, Python 3.6+).

The master's supervisor is the *hub*: it listens on a TCP port on master_addr (the data network
preflight proved); every worker's supervisor is a *peer* that connects to it. Both sides prove
they hold the run's secret (passed on stdin by the controller, never on argv, in the
environment or in a file) with an HMAC challenge, so the secret never crosses the wire. Then:

- heartbeats both ways every few seconds; silence longer than the lease, or a dropped
  connection, means the other side is lost;
- a peer reports its own failure to the hub; the hub records the first failure it hears of
  (its own included), in arrival order, as the run's root cause, and tells everyone to stop;
- a peer that ends normally says so before it closes, so the hub does not take it as lost.

One JSON object per line. Every socket is non-blocking and driven by the supervisor's loop.
"""

import contextlib
import errno
import hashlib
import hmac
import json
import os
import socket
import time

from clusterrun.remote.shared import protocol, timing

G = protocol.Gang
HEARTBEAT = 2.0
RETRY = 1.0


def mac(secret, nonce, who):
    return hmac.new(secret.encode(), ("%s|%s" % (nonce, who)).encode(),
                    hashlib.sha256).hexdigest()


def nonce():
    return os.urandom(16).hex()


class Conn:
    """One line-delimited JSON connection in the supervisor's loop."""

    def __init__(self, loop, sock, on_message, on_close):
        self.loop = loop
        self.sock = sock
        self.on_message = on_message
        self.on_close = on_close
        self.inbuf = b""
        self.outbuf = b""
        self.last_heard = time.monotonic()
        self.last_sent = 0.0
        self.closed = False
        self.peer = None  # hub side: the worker it authenticated as
        self.challenge = None  # hub side: the nonce it must answer
        sock.setblocking(False)
        loop.watch(sock, self._readable)

    def send(self, obj):
        if self.closed:
            return
        self.outbuf += json.dumps(obj).encode() + b"\n"
        self.last_sent = time.monotonic()
        self.flush()

    def flush(self):
        """Writes what the socket takes now; the rest on the next tick (never blocks)."""
        while self.outbuf and not self.closed:
            try:
                sent = self.sock.send(self.outbuf)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return
                self.close()
                return
            self.outbuf = self.outbuf[sent:]

    def _readable(self, _sock):
        try:
            data = self.sock.recv(65536)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return
            data = b""
        if not data:
            self.close()
            return
        self.last_heard = time.monotonic()
        self.inbuf += data
        while b"\n" in self.inbuf and not self.closed:
            line, self.inbuf = self.inbuf.split(b"\n", 1)
            try:
                msg = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                msg = None
            if not isinstance(msg, dict):
                self.close()
                return
            self.on_message(self, msg)
        if len(self.inbuf) > 65536:  # nobody honest sends a line that long
            self.close()

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.loop.unwatch(self.sock)
        with contextlib.suppress(OSError):
            self.sock.close()
        self.on_close(self)


class Hub:
    """The master's side. ``sup`` is its supervisor: ``gang_failure(root)`` stops the local job
    for a root cause elsewhere; the hub reads ``sup.root_cause`` for its own."""

    def __init__(self, loop, sup, *, name, secret, peers, addr, port, lease, start_within):
        self.loop = loop
        self.sup = sup
        self.name = name
        self.secret = secret
        self.lease = lease
        self.peers = dict.fromkeys(peers, "waiting")  # waiting, connected, ended, lost
        self.conns = {}
        self.connect_by = time.monotonic() + start_within
        self.root_cause = None
        self.stop_sent = None
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((addr, port or 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        loop.watch(self.listener, self._accept)

    def _accept(self, _sock):
        try:
            sock, _addr = self.listener.accept()
        except OSError:
            return
        conn = Conn(self.loop, sock, self._message, self._closed)
        conn.peer = None
        conn.challenge = nonce()
        conn.send({protocol.OP: G.HELLO, "nonce": conn.challenge})

    def _message(self, conn, msg):
        op = msg.get(protocol.OP)
        if conn.peer is None:
            self._auth(conn, msg)
        elif op == G.FAILED:
            self.record(dict(msg.get("root_cause") or {}, node=conn.peer))
        elif op == G.ENDED:
            peer = conn.peer
            self.peers[peer] = "ended"
            self._recorded()
            conn.close()
            if msg.get("cause") == "signal":  # someone stopped that node: stop them all
                self.sup.gang_stop(None, "%s was stopped" % peer)
        elif op in (G.PROGRESS, G.STACKS, G.LINKS_PORT, G.LINKS_PAIRS):  # remote/node/stallreach.py
            self.sup.on_gang(conn.peer, msg)

    def _auth(self, conn, msg):
        who = msg.get("node")
        want = mac(self.secret, conn.challenge, who)
        if (msg.get(protocol.OP) != G.AUTH or who not in self.peers
                or not hmac.compare_digest(want, str(msg.get("mac")))
                or self.peers[who] != "waiting"):
            conn.close()  # a stranger, a replay or a second connection: nothing to say
            return
        conn.peer = who
        self.peers[who] = "connected"
        self.conns[who] = conn
        self._recorded()
        conn.send({protocol.OP: G.WELCOME, "mac": mac(self.secret, msg.get("nonce"), self.name)})
        if self.root_cause is not None:
            conn.send({protocol.OP: G.STOP, "root_cause": self.root_cause})

    def _closed(self, conn):
        if conn.peer is not None and self.peers.get(conn.peer) == "connected":
            self.lose(conn.peer, "its connection to the master closed")

    def lose(self, peer, why):
        self.peers[peer] = "lost"
        self.conns.pop(peer, None)
        self._recorded()
        self.record({"node": peer, "rank": None, "code": None, "signal": None,
                     "detail": "%s was lost: %s" % (peer, why), "lost": True})

    def record(self, root):
        """The first failure the hub hears of is the root cause; everyone else stops."""
        if self.root_cause is not None:
            return
        self.root_cause = root
        self.sup.gang_failure(root)
        self.broadcast({protocol.OP: G.STOP, "root_cause": root})

    def stopped(self, why):
        """The master itself was stopped (`clusterrun stop`, a signal): stop the workers too."""
        if self.stop_sent is None:
            self.stop_sent = why
            self.broadcast({protocol.OP: G.STOP, "stopped": why})

    def broadcast(self, msg):
        for conn in list(self.conns.values()):
            conn.send(msg)

    def tell(self, peer, msg):
        """One message for one connected peer; whether it is connected."""
        conn = self.conns.get(peer)
        if conn is None:
            return False
        conn.send(msg)
        return True

    def connected(self):
        """The peers connected now."""
        return {p for p, s in self.peers.items() if s == "connected"}

    def address(self):
        """The address the hub listens on (master_addr)."""
        return self.listener.getsockname()[0]

    def tick(self):
        now = time.monotonic()
        for peer, status in list(self.peers.items()):
            conn = self.conns.get(peer)
            if status == "waiting" and now > self.connect_by:
                self.lose(peer, "its supervisor never reached the master")
            elif status == "connected" and conn is not None:
                if timing.over(now, conn.last_heard, self.lease):
                    conn.peer = None
                    conn.close()
                    self.lose(peer, "no heartbeat for %d s" % (now - conn.last_heard))
                    continue
                if timing.due(now, conn.last_sent, HEARTBEAT):
                    conn.send({protocol.OP: G.HEARTBEAT})
                conn.flush()

    def settled(self):
        """Every worker has ended or is lost: the hub may go."""
        return all(s in ("ended", "lost") for s in self.peers.values())

    def summary(self):
        return dict(self.peers)

    def _recorded(self):
        """The master's state.json says where each worker stands as it changes (connected,
        ended, lost), not only once the run has ended."""
        self.sup.state(peers=self.summary())


class Peer:
    """A worker's side: keeps a connection to the hub; loses the run when it loses the hub."""

    def __init__(self, loop, sup, *, name, secret, hub_name, addr, port, lease):
        self.loop = loop
        self.sup = sup
        self.name = name
        self.secret = secret
        self.hub_name = hub_name
        self.addr = (addr, port)
        self.lease = lease
        self.conn = None
        self.ready = False
        self.challenge = nonce()
        self.pending = []  # messages for the hub before it has accepted us
        self.next_try = 0.0
        self.give_up_at = time.monotonic() + lease
        self.gone = False  # the hub is lost (or we are done with it)

    def _connect(self):
        family = socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(min(RETRY, 1.0))
        try:
            sock.connect(self.addr)
        except OSError:
            sock.close()
            return
        self.conn = Conn(self.loop, sock, self._message, self._closed)

    def _message(self, conn, msg):
        op = msg.get(protocol.OP)
        if op == G.HELLO and not self.ready:
            conn.send({protocol.OP: G.AUTH, "node": self.name, "nonce": self.challenge,
                       "mac": mac(self.secret, msg.get("nonce"), self.name)})
        elif op == G.WELCOME and not self.ready:
            want = mac(self.secret, self.challenge, self.hub_name)
            if not hmac.compare_digest(want, str(msg.get("mac"))):
                conn.close()
                return
            self.ready = True
            for pending in self.pending:
                conn.send(pending)
            self.pending = []
        elif op == G.STOP and self.ready:
            self.sup.gang_stop(msg.get("root_cause"), msg.get("stopped"))
        elif op in (G.STACKS, G.STALL_STOP, G.LINKS_LISTEN, G.LINKS_CONNECT, G.LINKS_CLOSE) \
                and self.ready:  # the hub's stall watchdog
            self.sup.on_gang(None, msg)

    def _closed(self, _conn):
        self.conn = None
        if self.ready and not self.gone:
            self.lost("its connection closed")
        self.ready = False

    def lost(self, why):
        self.gone = True
        self.sup.gang_failure({"node": self.hub_name, "rank": None, "code": None,
                               "signal": None, "lost": True,
                               "detail": "%s (the master) was lost: %s" % (self.hub_name, why)})

    def send(self, msg):
        if self.ready and self.conn is not None:
            self.conn.send(msg)
        else:
            self.pending.append(msg)

    def undelivered(self):
        """Messages for the hub are still waiting for the connection to be accepted."""
        return bool(self.pending) and not self.gone

    def finish(self, info):
        """The local job has ended: say so (best effort) and let go of the hub."""
        self.gone = True
        self.send(dict(info, **{protocol.OP: G.ENDED}))
        if self.conn is not None:
            self.conn.sock.setblocking(True)
            self.conn.sock.settimeout(2)
            self.conn.flush()

    def tick(self):
        if self.gone:
            return
        now = time.monotonic()
        if self.conn is None:
            if now > self.give_up_at:
                self.lost("cannot connect to %s:%d" % self.addr)
            elif now >= self.next_try:
                self.next_try = now + RETRY
                self._connect()
            return
        quiet = now - self.conn.last_heard
        if timing.over(now, self.conn.last_heard, self.lease):
            self.gone = True
            self.conn.close()
            self.lost("no heartbeat for %d s" % quiet)
            return
        if self.ready and timing.due(now, self.conn.last_sent, HEARTBEAT):
            self.conn.send({protocol.OP: G.HEARTBEAT})
        self.conn.flush()


def join(sup, link, loop):
    """Detached (``link``: the request's ``gang``): the master's supervisor becomes the hub, a
    worker's its peer. OSError: it cannot listen, or not connect."""
    if not link:
        return
    if link["role"] == "hub":
        sup.hub = Hub(loop, sup, name=sup.name, secret=link["secret"], peers=link["peers"],
                      addr=link["addr"], port=link.get("port"), lease=sup.lease,
                      start_within=float(link.get("start_within", 60 + sup.lease)))
    else:
        sup.peer = Peer(loop, sup, name=sup.name, secret=link["secret"],
                        hub_name=link["hub_node"], addr=link["addr"], port=int(link["port"]),
                        lease=sup.lease)
