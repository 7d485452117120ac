"""Preflight's facts about a host: the probe and what it reads (see remote/__init__.py)."""
