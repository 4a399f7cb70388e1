"""Maintenance scripts of the repository (run with python scripts/NAME.py)."""
