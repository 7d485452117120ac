"""The network side of a host's facts and of the probe's answers (clusterrun/remote/probe/probe.py,
sysinfo.py), read once into frozen values: its interfaces and their links, the route to an
address, and what a name resolves to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from clusterrun.jsonfields import flag, integer, items, number, obj, strings, text


@dataclass(frozen=True)
class Interface:
    """``addrs``: CIDRs, IPv4 and IPv6 (``10.0.0.1/24``); ``up``: up and running."""

    name: str
    up: bool = False
    addrs: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, value: object) -> Optional[Interface]:
        """None for an entry without a name (the probe names every one)."""
        found = obj(value)
        name = text(found.get("name"))
        if name is None:
            return None
        return cls(name, flag(found.get("up")) is True, strings(found.get("addrs")))

    @property
    def ipv4(self) -> Optional[str]:
        """The first IPv4 address it holds."""
        return next((a.split("/")[0] for a in self.addrs if ":" not in a.split("/")[0]), None)

    def holds(self, addr: str) -> bool:
        return any(cidr.split("/")[0] == addr for cidr in self.addrs)


def interfaces(value: object) -> tuple[Interface, ...]:
    found = (Interface.from_json(item) for item in items(value))
    return tuple(i for i in found if i is not None)


@dataclass(frozen=True)
class Link:
    """An interface's MTU and speed in Mbit/s (None where the driver does not say)."""

    mtu: Optional[int] = None
    speed: Optional[int] = None


def links(value: object) -> Mapping[str, Link]:
    """interface -> Link; an interface the probe sent nothing for is left out (unknown)."""
    return {str(name): Link(integer(obj(link).get("mtu")), integer(obj(link).get("speed")))
            for name, link in obj(value).items() if obj(link)}


@dataclass(frozen=True)
class Route:
    """The probe's answer for the way to an address: the device and source address, ``local``
    when this host holds the address itself, ``error`` when there is no route."""

    dev: Optional[str] = None
    src: Optional[str] = None
    local: bool = False
    error: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Route:
        found = obj(value)
        return cls(text(found.get("dev")), text(found.get("src")),
                   flag(found.get("local")) is True, text(found.get("error")))


@dataclass(frozen=True)
class Lookup:
    """What a name resolved to on a host, and how long that took (``hostname``: the name,
    where the answer does not key it by name)."""

    addresses: tuple[str, ...] = ()
    error: Optional[str] = None
    seconds: Optional[float] = None
    hostname: Optional[str] = None

    @classmethod
    def from_json(cls, value: object) -> Lookup:
        found = obj(value)
        return cls(strings(found.get("addresses")), text(found.get("error")),
                   number(found.get("seconds")), text(found.get("hostname")))


def lookups(value: object) -> Mapping[str, Lookup]:
    """name -> Lookup, as the probe's `resolve` answers and ``names.resolved`` hold them."""
    return {str(name): Lookup.from_json(found) for name, found in obj(value).items()}


@dataclass(frozen=True)
class Names:
    """The host's own name and fully qualified name, and what each resolves to there
    (``resolved`` None: the probe did not say)."""

    hostname: Optional[str] = None
    fqdn: Optional[str] = None
    resolved: Optional[Mapping[str, Lookup]] = None

    @classmethod
    def from_json(cls, value: object) -> Names:
        found = obj(value)
        resolved = found.get("resolved")
        return cls(text(found.get("hostname")), text(found.get("fqdn")),
                   lookups(resolved) if isinstance(resolved, dict) else None)
