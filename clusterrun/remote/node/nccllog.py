"""What NCCL chose on this host, read from its INFO log files (stdlib only, Python 3.6+).

`clusterrun launch` sets NCCL_DEBUG=INFO and NCCL_DEBUG_FILE=<rundir>/nccl-%h.%p.log (NCCL puts
the hostname and the pid in the name: one file per process). The supervisor's ``Watcher`` reads
only the bytes added since its last look, feeds the lines to a ``Digest`` and reports the summary
when it changes: the interface and address NCCL bootstraps on, the network it uses (IB, Socket,
a plugin's), the IB devices, whether GPUDirect RDMA is in use, and which ranks finished
initialising their communicator.

The lines differ between NCCL releases; every form this reads is kept, with the thread it was
captured from, under tests/golden/nccl/. A line that matches nothing is ignored, so a release
that words things differently makes the summary poorer, never wrong.
"""

import glob
import os
import re

# The files NCCL_DEBUG_FILE names, "nccl-%h.%p.log" in the run's folder
# (clusterrun/plan/environment.py), once NCCL has put in the hostname and the pid.
FILE_GLOB = "nccl-*.log"
# The files are read at most this often, and at most this much of each at a time: cheap enough
# for the supervisor's loop, whatever the ranks log; NCCL writes what it chose while a
# communicator is set up, so a second late is soon enough.
READ_EVERY = 1.0
READ_LIMIT = 1 << 20

# `host:pid:tid [cudaDev] NCCL INFO message`, anywhere in the line: mpirun's `[N] ` tags, a
# timestamp or a launcher's prefix may come first.
_INFO = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):\d+ \[\d+\] NCCL INFO (?P<msg>.*)")
_VERSION = re.compile(r"NCCL version (?P<version>\d[^\s+]*)")
# `eth0:10.0.0.1<0>`, `[0]eth0:10.0.0.1<0>`, `ib0:fe80::1%ib0<0>`: a name cannot hold ':'.
_ADDR = r"(?:\[\d+\])?(?P<iface>[^\s:\[\]]+):(?P<addr>[^\s<]+)<\d+>"
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using " + _ADDR)
_SOCKET = re.compile(r"^NET/Socket ?: Using " + _ADDR)
_IB = re.compile(r"^NET/IB ?: Using (?P<devices>.*?)\s*;\s*OOB " + _ADDR)
_IB_DEVICE = re.compile(r"\[\d+\](?P<name>[^\s:\[\]/]+:\d+)/(?P<link>[A-Za-z]+)")
_NO_IB = re.compile(r"^NET/IB ?: No device found")
_NETWORK = re.compile(r"^Using network (?P<network>.+?)\s*$")
# `comm 0x55.. rank 3 nranks 16 cudaDev 3 ... - Init COMPLETE` (and START, 2.12 on; before
# 2.12 a rank that hangs in init says nothing with its rank in it).
_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)\b"
                   r".* - Init (?P<what>START|COMPLETE)", re.IGNORECASE)
_NODES = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+)"
                    r" nNodes (?P<nodes>\d+)")
# `Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0(1)/GDRDMA`, `Ring 00 : 1 -> 2 via NET/Socket/0`
_VIA = re.compile(r"via NET/(?P<network>[^/\s]+)/\d+(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
_GDR_ON = re.compile(r"GPU Direct RDMA Enabled for GPU")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled for")


def is_ib(network):
    """IB and the IB plugins (IBext, IBext_v8, ...): RDMA, as opposed to NCCL's TCP sockets."""
    return bool(network) and network.upper().startswith("IB")


class Digest:
    """Everything the lines of one host's NCCL logs say, kept as sets: any number of processes,
    each with any number of communicators (a process may drive several GPUs)."""

    def __init__(self, host=None):
        self.host = host  # only lines of this host (None: all)
        self.version = None
        self.bootstrap = set()  # (iface, addr)
        self.oob = set()
        self.socket = set()
        self.networks = set()  # "Using network X"
        self.via = set()  # networks channels go through
        self.devices = set()  # "mlx5_0:1/IB"
        self.no_ib = False
        self.gdr_channels = [0, 0]  # NET channels without, with GPUDirect RDMA
        self.gdr_said = set()  # "on"/"off" from the NET subsystem's own lines
        self.comms = {}  # (host, pid, comm) -> {"rank", "nranks", "done", "nodes"}

    def feed(self, line):
        version = _VERSION.search(line)
        if version is not None:
            self.version = version.group("version")
            return
        info = _INFO.search(line)
        if info is None or (self.host is not None and info.group("host") != self.host):
            return
        msg = info.group("msg")
        key = (info.group("host"), info.group("pid"))
        for parse in (self._addresses, self._network, self._comm, self._gdr):
            if parse(msg, key):
                return

    def _addresses(self, msg, _key):
        for pattern, found in ((_BOOTSTRAP, self.bootstrap), (_SOCKET, self.socket),
                               (_IB, self.oob)):
            match = pattern.search(msg)
            if match is not None:
                found.add((match.group("iface"), match.group("addr")))
                if pattern is _IB:
                    self.devices.update("%s/%s" % d for d in _IB_DEVICE.findall(
                        match.group("devices")))
                return True
        if _NO_IB.search(msg):
            self.no_ib = True
            return True
        return False

    def _network(self, msg, _key):
        match = _NETWORK.search(msg)
        if match is not None:
            self.networks.add(match.group("network"))
            return True
        match = _VIA.search(msg)
        if match is not None:
            self.via.add(match.group("network"))
            self.gdr_channels[1 if match.group("gdr") else 0] += 1
            return True
        return False

    def _comm(self, msg, key):
        match = _NODES.search(msg) or _INIT.search(msg)
        if match is None:
            return False
        comm = self.comms.setdefault((*key, match.group("comm")), {
            "rank": int(match.group("rank")), "nranks": int(match.group("nranks")),
            "done": False, "nodes": None})
        if "nodes" in match.groupdict():
            comm["nodes"] = int(match.group("nodes"))
        elif match.group("what").upper() == "COMPLETE":
            comm["done"] = True
        return True

    def _gdr(self, msg, _key):
        if _GDR_ON.search(msg):
            self.gdr_said.add("on")
        elif _GDR_OFF.search(msg):
            self.gdr_said.add("off")
        else:
            return False
        return True

    # -- the summary ---------------------------------------------------------------------

    def network(self):
        """What NCCL said it uses; else what its channels go through; else what it set up
        (NCCL before 2.10 said nothing more than `NET/IB : Using`). Before 2.5 every process
        printed `NET/Socket : Using` for its bootstrap, so that line names the network only
        beside a `Bootstrap : Using` line."""
        said = self.networks or self.via
        if said:
            return sorted(said)
        if self.oob and not self.no_ib:
            return ["IB"]
        return ["Socket"] if self.socket and self.bootstrap else []

    def interfaces(self):
        """Where NCCL bootstraps: its own line, else the IB OOB or socket interface (before
        2.5 the bootstrap interface was the first `NET/Socket : Using`)."""
        return sorted(self.bootstrap or self.oob or self.socket)

    def gdr(self, networks):
        if not any(is_ib(n) for n in networks):
            return None
        without, with_gdr = self.gdr_channels
        if with_gdr or without:
            return "on" if not without else "off" if not with_gdr else "partly"
        if len(self.gdr_said) == 1:
            return next(iter(self.gdr_said))
        return "partly" if self.gdr_said else None

    def summary(self, world_size=None):
        """A plain dict for the wire and state.json. The ranks are those of the world's
        communicator (``world_size`` ranks; else the largest one seen): a script's subgroups
        come and go, the world's communicator is what every rank must join."""
        networks = self.network()
        comms = list(self.comms.values())
        sizes = {c["nranks"] for c in comms}
        size = world_size if world_size in sizes else max(sizes) if sizes else None
        world = [c for c in comms if c["nranks"] == size]
        nodes = {c["nodes"] for c in world if c["nodes"] is not None}
        return {
            "version": self.version,
            "interfaces": [list(pair) for pair in self.interfaces()],
            "networks": networks,
            "devices": sorted(self.devices),
            "no_ib": self.no_ib,
            "gdr": self.gdr(networks),
            "nranks": size,
            "nnodes": max(nodes) if nodes else None,
            "init_started": sorted({c["rank"] for c in world}),
            "init_done": sorted({c["rank"] for c in world if c["done"]}),
        }


class Watcher:
    """The NCCL files of one run's folder on this host, read by offset: each poll reads only
    what was added (up to READ_LIMIT per file), and returns the summary when it has changed."""

    def __init__(self, folder, world_size=None):
        self.folder = folder
        self.world_size = world_size
        self.digest = Digest()
        self.offsets = {}  # file name -> bytes read
        self.partial = {}  # file name -> an unfinished last line
        self.last = None  # the summary last returned
        self.next_poll = 0.0

    def poll(self, now, force=False):
        if not force and now < self.next_poll:
            return None
        self.next_poll = now + READ_EVERY
        read = False
        for path in sorted(glob.glob(os.path.join(self.folder, FILE_GLOB))):
            read = self._read(path) or read
        if not read and self.last is not None:
            return None
        if not self.digest.comms and not self.digest.interfaces() and not self.digest.networks:
            return None  # no file, or nothing in them yet: nothing to say
        summary = self.digest.summary(self.world_size)
        if summary == self.last:
            return None
        self.last = summary
        return summary

    def _read(self, path):
        name = os.path.basename(path)
        offset = self.offsets.get(name, 0)
        try:
            size = os.path.getsize(path)
            if size < offset:  # a new file under the same name (a restarted process)
                offset, self.partial[name] = 0, b""
            if size == offset:
                return False
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(min(READ_LIMIT, size - offset))
        except OSError:
            return False
        self.offsets[name] = offset + len(data)
        *lines, rest = (self.partial.pop(name, b"") + data).split(b"\n")
        self.partial[name] = rest[-READ_LIMIT:]
        for line in lines:
            self.digest.feed(line.decode("utf-8", "replace"))
        return True


def digest_text(text, host=None, world_size=None):
    """The summary of a log's text (one host's lines when ``host`` is given)."""
    digest = Digest(host)
    for line in text.splitlines():
        digest.feed(line)
    return digest.summary(world_size)
