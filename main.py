"""Google Cloud Functions entry (the functions framework loads ./main.py from the source root).

`on_maintenance_event` takes Pub/Sub `messagePublished` CloudEvents from either of two feeds:
an Eventarc trigger on the events topic (`gcloud functions deploy --trigger-topic`), or a push
subscription of its own whose raw push body the functions framework turns into the same
CloudEvent. The Terraform (infra/terraform/gcp/function.tf, pubsub.tf) deploys the second, with no
Eventarc trigger, because Eventarc's subscription cannot carry a dead-letter policy in Terraform.
docs/gcp.md has the rest.

`on_central_log_entry` and `on_central_tick` are the control plane's path
(functions/gcp_app/central_entry.py): the system-event log entries a log sink routes to Pub/Sub,
and a scheduler's tick once a minute.
"""

from __future__ import annotations

from functions.gcp_app.central_entry import on_central_log_entry, on_central_tick
from functions.gcp_app.entry import on_maintenance_event

__all__ = ["on_central_log_entry", "on_central_tick", "on_maintenance_event"]
