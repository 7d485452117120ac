"""The node supervisor (run.py) and what only it uses (see remote/__init__.py)."""
