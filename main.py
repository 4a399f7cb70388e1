"""Google Cloud Functions entry (the functions framework loads ./main.py from the source root).

Deploy with `--entry-point on_maintenance_event` and an Eventarc trigger on the events topic;
docs/gcp.md has the rest.
"""

from __future__ import annotations

from functions.gcp_app.entry import on_maintenance_event

__all__ = ["on_maintenance_event"]
