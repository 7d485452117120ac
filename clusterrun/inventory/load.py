"""Reading an inventory: YAML -> validated HostSpecs, every problem reported with its line."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from clusterrun.errors import InventoryError
from clusterrun.inventory import adhoc, hostfile, ranges, slurm, toplevel, values, yaml_lines
from clusterrun.inventory.checker import Checker as _Checker
from clusterrun.inventory.checker import check_unique
from clusterrun.inventory.hosts import (
    AUTO,
    DEFAULTS,
    LOCAL_HOSTS,
    HostSpec,
    Inventory,
    where_it_runs,
)
from clusterrun.inventory.toplevel import HOST_ONLY as _HOST_ONLY
from clusterrun.inventory.toplevel import HOST_SETTINGS as _HOST_SETTINGS
from clusterrun.inventory.yaml_lines import Located

if TYPE_CHECKING:
    from clusterrun.inventory.pylock import PythonEnv


# The same characters OpenSSH's ssh_valid_hostname() refuses, and more: anything a shell or ssh
# would read as syntax or an option. Host names and aliases are letters, digits, '.', '_', '-'.
_HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
# DNS (RFC 1035): a name is at most 253 characters (one more for a trailing dot), each
# dot-separated label 1-63. Longer ones pass a regex and then fail deep inside SSH's resolver.
_NAME_MAX, _LABEL_MAX = 253, 63
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,62}$")
# An IPv6 zone in a host address: an interface name or index, nothing a shell would read.
_ZONE_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")

def _replace(spec: HostSpec, **changes: Any) -> HostSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def _environment(chk: _Checker, value: Located) -> Optional[PythonEnv]:
    # Imported here: reading a lock (TOML, uv's graph) is for inventories that have one, and
    # every command reads an inventory.
    from clusterrun.inventory import lockfile

    return lockfile.parse(chk, value)


def _settings(chk: _Checker, found: dict[str, Located]) -> dict[str, Any]:
    """Parse the keys a host and `defaults` share; absent keys are absent from the result."""
    parsers: dict[str, Callable[[Located], Any]] = {
        "user": lambda v: values.text(chk, v, "user", values.USER_RE, values.USER_RULE),
        "port": lambda v: values.port(chk, v, "port"),
        "identity_file": lambda v: values.local_file(chk, v, "identity_file"),
        # Missing is allowed: --accept-new-host-keys creates it, and without it every host is
        # unknown, which the host-key error says.
        "known_hosts": lambda v: values.local_file(chk, v, "known_hosts", may_be_missing=True),
        "python": lambda v: values.path(chk, v, "python"),
        "setup": lambda v: values.text(chk, v, "setup"),
        "workdir": lambda v: values.path(chk, v, "workdir"),
        "nproc_per_node": lambda v: values.nproc(chk, v),
        "interface": lambda v: AUTO if v.value == AUTO else values.interface(chk, v),
        "env": lambda v: values.env(chk, v),
        "forward_env": lambda v: values.globs(chk, v),
        "env_file": lambda v: values.env_file(chk, v),
        "container": lambda v: values.text(chk, v, "container", values.CONTAINER_RE,
                                           values.CONTAINER_RULE),
        "container_engine": lambda v: values.engine(chk, v),
        "proxy_jump": lambda v: _jump(chk, v),
        "environment": lambda v: _environment(chk, v),
        "container_user": lambda v: values.text(chk, v, "container_user",
                                                values.CONTAINER_USER_RE,
                                                "give a user name or uid, optionally :group."),
    }
    return {key: parsers[key](loc) for key, loc in found.items() if key in parsers}


def _jump(chk: _Checker, loc: Located) -> Optional[str]:
    """``[user@]host[:port]`` (``[v6addr]:port``), each part held to the rules of its key."""
    value = values.text(chk, loc, "proxy_jump")
    if value is None:
        return None
    user, _, rest = value.rpartition("@")
    host, port = rest, ""
    if rest.startswith("[") and "]" in rest:
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ("x" if tail else "")
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    good = ((not user or values.USER_RE.fullmatch(user) is not None)
            and (_HOST_RE.fullmatch(host) is not None or _ip_host(host))
            and (not port or (port.isdigit() and 1 <= int(port) <= 65535)))
    if not good:
        chk.fail(loc.line, f"proxy_jump {value!r} is not allowed: write [user@]host[:port] "
                 "(e.g. ops@bastion.example.com:2222); " + values.HOST_RULE)
        return None
    return value


def _ip_host(value: str) -> bool:
    """An IP address; an IPv6 zone (``fe80::1%eth0``) must be an interface name, since
    ``ipaddress`` accepts any text there (``fe80::1%x;$(id)``)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    _, _, zone = value.partition("%")
    return not zone or _ZONE_RE.fullmatch(zone) is not None


def _host(chk: _Checker, index: int, loc: Located, defaults: dict[str, Any]) -> Optional[HostSpec]:
    where = f"hosts[{index}]"
    if isinstance(loc.value, str):  # `- 10.0.0.11` shorthand
        loc = Located({"host": loc}, loc.line)
    found = chk.keys(loc, _HOST_ONLY + _HOST_SETTINGS, where)
    if not found and not isinstance(loc.value, dict):
        return None
    if "host" not in found:
        chk.fail(loc.line, f"{where}: missing `host:` (the SSH address or ~/.ssh/config alias).")
        return None
    host = _address(chk, found["host"], where)
    if host is None:
        return None
    name = host
    if "name" in found:
        name = values.text(chk, found["name"], f"{where}.name", _NAME_RE,
                    "a name is letters, digits, '.', '_' and '-' (at most 63), not starting "
                    "with '.' or '-'.") or host
    elif not _NAME_RE.fullmatch(host):  # an IPv6 address: ':' and '%' make poor file names
        name = re.sub(r"[^A-Za-z0-9._-]", "-", host)
    master = "master" in found and bool(values.flag(chk, found["master"], f"{where}.master"))
    spare = "spare" in found and bool(values.flag(chk, found["spare"], f"{where}.spare"))
    if master and spare:
        # No index in the message: every host of a range repeats it on the same line.
        chk.fail(found["spare"].line, "a host cannot be both `master: true` and `spare: true`: "
                 "the master runs every attempt and a spare none until a host fails. Remove "
                 "one of the two.")
    gpus = None
    if "gpus" in found:
        gpus = _gpus(chk, found["gpus"], where)
    settings = dict(defaults)
    own = _settings(chk, found)
    if "env" in own and own["env"] is not None:
        own["env"] = {**(defaults.get("env") or {}), **own["env"]}
    settings.update({k: v for k, v in own.items() if v is not None})
    env = tuple(sorted((settings.pop("env") or {}).items()))
    _where_it_runs(settings, local=host in LOCAL_HOSTS)
    return HostSpec(host=host, name=name, master=master, line=loc.line, gpus=gpus, env=env,
                    spare=spare, **settings)


def _where_it_runs(settings: dict[str, Any], *, local: bool) -> None:
    """Defaults that differ on this machine: local hosts run clusterrun's own interpreter and
    keep their files under $CLUSTERRUN_HOME. Inside a container, this machine's paths mean
    nothing: there the defaults are a remote host's."""
    python, workdir = where_it_runs(own=local and not settings.get("container"))
    if settings.get("python") is None:
        settings["python"] = python
    if settings.get("workdir") is None:
        settings["workdir"] = workdir


def _address(chk: _Checker, loc: Located, where: str) -> Optional[str]:
    host = loc.value
    if isinstance(host, str) and "@" in host:
        chk.fail(loc.line, f"{where}.host {host!r}: put the user in `user:`, not in the host.")
        return None
    if not (isinstance(host, str) and (_HOST_RE.fullmatch(host) or _ip_host(host))):
        if isinstance(host, str):
            chk.fail(loc.line, f"{where}.host {host!r} is not allowed: {values.HOST_RULE}")
        else:
            values.text(chk, loc, f"{where}.host")  # says why: a YAML boolean, a number...
        return None
    if not _ip_host(host):
        problem = _dns_length(host)
        if problem:
            chk.fail(loc.line, f"{where}.host {_clip(host)!r}: {problem}")
            return None
    return host


def _dns_length(host: str) -> Optional[str]:
    """What is wrong with a host name's length, in words; None if nothing."""
    name = host[:-1] if host.endswith(".") else host
    if len(name) > _NAME_MAX:
        return (f"the name is {len(host)} characters long; a DNS name is at most {_NAME_MAX} "
                "(a trailing dot aside). Use a shorter name or the host's IP address.")
    for label in name.split("."):
        if not label:
            return "empty label ('..'): a DNS name has no empty parts between its dots."
        if len(label) > _LABEL_MAX:
            return (f"the label {_clip(label)!r} is {len(label)} characters long; each "
                    f"dot-separated label of a DNS name is at most {_LABEL_MAX}. Use a shorter "
                    "name, an ~/.ssh/config alias or the host's IP address.")
    return None


def _clip(text: str, keep: int = 40) -> str:
    return text if len(text) <= keep else text[:keep] + "..."


def _gpus(chk: _Checker, loc: Located, where: str) -> Optional[tuple[int, ...]]:
    items = loc.value if isinstance(loc.value, list) else None
    values = [i.value for i in items] if items is not None else None
    if (values is None or not values
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values)
            or len(set(values)) != len(values)):
        chk.fail(loc.line, f"{where}.gpus must be a list of distinct GPU indices, e.g. [0, 1].")
        return None
    return tuple(values)


def load(path: Union[str, Path]) -> Inventory:
    """Read and validate an inventory (a YAML file, or a hostfile given directly); raise
    InventoryError listing every problem with its file and line."""
    word = str(path)  # as given: Path() would make `./inv` the word `inv`
    path = Path(path)
    if str(path) == slurm.WORD and not path.exists():  # INVENTORY `slurm`: settings as a hostfile
        chk = _Checker(path)
        job, items = slurm.allocation(chk, 1, os.environ)
        chk.raise_if_any()
        inv = _finish(chk, chk, path, items, defaults=dict(DEFAULTS), master_addr=AUTO,
                      master_port=None)
        return _in_job(inv, job, "srun")
    if not path.exists() and adhoc.is_host_list(word):  # `gpu[01-04]`, `a,b`, `localhost`
        return from_hosts(word)
    toplevel.not_a_script(path)
    if hostfile.looks_like(path):  # SSH settings: ~/.ssh/config and the command line
        chk = _Checker(path)
        return _finish(chk, chk, path, hostfile.read(chk, path), defaults=dict(DEFAULTS),
                       master_addr=AUTO, master_port=None)
    root = yaml_lines.load(path)
    chk = _Checker(path)
    top = toplevel.keys(chk, root)
    chk.raise_if_any()
    defaults = dict(DEFAULTS)
    nproc_set = False
    if "defaults" in top and top["defaults"].value is not None:  # None: all commented out
        found = chk.keys(_without_spare(chk, top["defaults"]), _HOST_SETTINGS, "defaults")
        nproc_set = "nproc_per_node" in found
        defaults.update({k: v for k, v in _settings(chk, found).items() if v is not None})
    master_addr = AUTO
    if "master_addr" in top and top["master_addr"].value != AUTO:
        loc = top["master_addr"]
        if not (isinstance(loc.value, str) and _ip_host(loc.value)):
            chk.fail(loc.line, f"master_addr: {loc.value!r} must be `auto` or an IP address "
                     "(the master's address on the network the ranks should use).")
        else:
            master_addr = loc.value
    master_port = None
    if "master_port" in top and top["master_port"].value != AUTO:
        master_port = values.port(chk, top["master_port"], "master_port")
    hosts_loc = top.get("hosts")
    transport = _transport(chk, top, slurm_hosts=hosts_loc is not None
                           and hosts_loc.value == slurm.WORD)
    if "hostfile" in top:
        return _from_hostfile(chk, top, defaults, nproc_set=nproc_set, master_addr=master_addr,
                              master_port=master_port)
    if hosts_loc is not None and hosts_loc.value == slurm.WORD:
        job, items = slurm.allocation(chk, hosts_loc.line, os.environ)
        chk.raise_if_any()
        inv = _finish(chk, chk, path, items, defaults=defaults, master_addr=master_addr,
                      master_port=master_port)
        return _in_job(inv, job, transport)
    if hosts_loc is None or not isinstance(hosts_loc.value, list) or not hosts_loc.value:
        line = hosts_loc.line if hosts_loc else root.line
        chk.fail(line, "`hosts:` must be a non-empty list, e.g.\n  hosts:\n    - host: 10.0.0.11"
                 "\nor `hostfile: PATH` (a DeepSpeed/MPI hostfile), or `hosts: slurm` (the nodes "
                 "of the Slurm allocation this runs in).")
        chk.raise_if_any()
    assert hosts_loc is not None
    return _finish(chk, chk, path, hosts_loc.value, defaults=defaults, master_addr=master_addr,
                   master_port=master_port)


def from_hosts(word: str, what: str = "INVENTORY") -> Inventory:
    """The hosts a NodeSet names (``gpu[01-04]``, ``a,b``), with the defaults every inventory
    has: how each is reached is left to ~/.ssh/config, as for an inventory's host that names
    no `user:`, `port:`, `identity_file:` or `proxy_jump:`. ``what``: where the word came from
    (INVENTORY, or -w/--hosts given alone), for the message when it names no host."""
    path = Path(word)
    chk = _Checker(path)
    items = [Located({"host": Located(name, 1)}, 1) for name in adhoc.names(word, what)]
    try:
        inv = _finish(chk, chk, path, items, defaults=dict(DEFAULTS), master_addr=AUTO,
                      master_port=None)
    except InventoryError as exc:  # each line is `WORD:1: hosts[i].host ...`: no file here
        why = "; ".join(re.sub(r"^hosts\[\d+\]\.host ", "", line.removeprefix(f"{path}:1: "))
                        .rstrip(".") for line in exc.message.splitlines())
        raise InventoryError(adhoc.neither(word, why, what)) from None
    from dataclasses import replace

    return replace(inv, adhoc=True)


def _without_spare(chk: _Checker, loc: Located) -> Located:
    """`defaults:` less a `spare:`, refused with its own reason rather than as an unknown key."""
    if not isinstance(loc.value, dict) or "spare" not in loc.value:
        return loc
    chk.fail(loc.value["spare"].line, "`spare:` is refused in `defaults:`: a spare is a host held "
             "back for restarts, and a run needs hosts that are not. Set `spare: true` on the "
             "hosts to hold back.")
    return Located({k: v for k, v in loc.value.items() if k != "spare"}, loc.line)


def _transport(chk: _Checker, top: dict[str, Located], *, slurm_hosts: bool) -> str:
    loc = top.get("transport")
    if loc is None:
        return "srun"
    if not slurm_hosts:
        chk.fail(loc.line, "`transport:` applies to `hosts: slurm` only; other hosts are "
                 "reached over SSH.")
    elif loc.value not in slurm.TRANSPORTS:
        chk.fail(loc.line, f"transport: {loc.value!r} must be srun (job steps, the default) or "
                 "ssh.")
    return str(loc.value)


def _in_job(inv: Inventory, job: str, transport: str) -> Inventory:
    """The allocation's nodes, reached with job steps of ``job`` unless `transport: ssh`."""
    if transport != "srun":
        return inv
    hosts = tuple(_replace(h, transport="srun", slurm_job=job) for h in inv.hosts)
    return Inventory(inv.path, hosts, inv.master_addr, inv.master_port, inv.master_named)


def _from_hostfile(chk: _Checker, top: dict[str, Located], defaults: dict[str, Any], *,
                   nproc_set: bool, master_addr: str, master_port: Optional[int]) -> Inventory:
    """`hostfile: PATH` (relative to the inventory): its hosts, with its slots as their
    nproc_per_node unless `defaults` sets one; its problems keep the hostfile's lines."""
    loc = top["hostfile"]
    if "hosts" in top:
        chk.fail(top["hosts"].line, "give either `hosts:` or `hostfile:`, not both.")
    name = values.path(chk, loc, "hostfile")
    chk.raise_if_any()
    assert name is not None
    hf = chk.path.parent / os.path.expanduser(name)
    found = values.kind(hf)
    if found == "directory":
        chk.fail(loc.line, f"hostfile {name!r} ({hf}) is a directory; `hostfile:` names the "
                 "file of `host slots=N` lines, relative to the inventory's directory.")
        chk.raise_if_any()
    if found not in ("file", "missing", "other"):
        chk.fail(loc.line, f"hostfile {name!r} ({hf}): cannot look at it: {found}.")
        chk.raise_if_any()
    if found != "file":
        chk.fail(loc.line, f"hostfile {name!r}: no such file ({hf}). The path is relative to the "
                 "inventory's directory.")
        chk.raise_if_any()
    sub = _Checker(hf)
    items = hostfile.read(sub, hf)
    if nproc_set:
        items = [Located({k: v for k, v in i.value.items() if k != "nproc_per_node"}, i.line)
                 for i in items]
    return _finish(chk, sub, chk.path, items, defaults=defaults, master_addr=master_addr,
                   master_port=master_port)


def _finish(chk: _Checker, hchk: _Checker, path: Path, items: list[Located], *,
            defaults: dict[str, Any], master_addr: str, master_port: Optional[int]) -> Inventory:
    """Hosts from entries read by ``hchk`` (the inventory's checker, or a hostfile's): ranges
    expanded, each host validated, then duplicates and the master settled."""
    items = ranges.expand_items(hchk, items)
    specs = [_host(hchk, i, loc, defaults) for i, loc in enumerate(items)]
    if hchk is not chk:
        chk.absorb(hchk)
        specs = [_replace(s, source=str(hchk.path)) if s else None for s in specs]
    chk.raise_if_any()
    hosts = [s for s in specs if s is not None]
    check_unique(chk, hosts)
    chk.raise_if_any()
    if all(h.spare for h in hosts):
        chk.fail(hosts[0].line, "every host is `spare: true`; a run starts on the hosts that "
                 "are not spares, so at least one must not be.", hosts[0].source)
        chk.raise_if_any()
    named = any(h.master for h in hosts)
    if not named:  # the first host that runs the first attempt: a spare may never run at all
        first = next(i for i, h in enumerate(hosts) if not h.spare)
        hosts[first] = _replace(hosts[first], master=True)
    return Inventory(path, tuple(hosts), master_addr, master_port, master_named=named)
