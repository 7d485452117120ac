"""What the host programs share and the controller never runs (see remote/__init__.py)."""
