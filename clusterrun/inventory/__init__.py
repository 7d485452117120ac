"""The host inventory: which hosts, how each is reached, and with what settings."""

from clusterrun.inventory.hosts import AUTO, PER_HOST, HostSpec, Inventory
from clusterrun.inventory.load import load

__all__ = ["AUTO", "PER_HOST", "HostSpec", "Inventory", "load"]
