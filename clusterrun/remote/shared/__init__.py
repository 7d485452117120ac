"""The rules and names both ends use; the only room of remote/ the controller imports (see
remote/__init__.py)."""
