"""The one-shot programs the controller's commands run on a host (see remote/__init__.py)."""
