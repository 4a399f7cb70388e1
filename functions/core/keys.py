"""What the function core's state is keyed by: an event, one VM's part of it, and one VM's report.

An event's drains and budget slots belong to the event across its statuses (`event_key`); its
lifecycle and its place in a budget's waiting line belong to each VM's own part (`subject_key`);
an idempotency claim belongs to one VM's report of one envelope (`claim_key`).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from wire.model import MaintenanceEvent


def event_key(event: MaintenanceEvent) -> str:
    """The event across its statuses (drains and budget belong to the event, not the step)."""
    event_id = event.event_id.lower() if event.cloud.value == "azure" else event.event_id
    return f"{event.cloud.value}:{event_id}"


def subject_key(event: MaintenanceEvent) -> str:
    """The event as one VM lives it: its own part of the lifecycle and of the budget's waiting line.

    `event` is a VM's own part (`own_part`), whose reporter is that VM.
    """
    return f"{event_key(event)}|{event.reporter}"


_ENDED = "ended|"


def ended_key(event: MaintenanceEvent) -> str:
    """Where the end of the event for its VM is remembered (a key of `StateStore.remember`)."""
    return f"{_ENDED}{subject_key(event)}"


def ended_subject(key: str) -> tuple[str, str] | None:
    """(event key, VM) of an `ended_key`, or None for any other key: a store may keep an end beside
    the event's drains. A VM name never holds '|'; an event id may, so the VM is the last part."""
    if not key.startswith(_ENDED):
        return None
    event, bar, vm = key[len(_ENDED) :].rpartition("|")
    return (event, vm) if bar and event and vm else None


def own_part(event: MaintenanceEvent, vm: str) -> MaintenanceEvent:
    """The event as far as `vm`'s own report may move it: that VM, and only that VM."""
    return replace(event, reporter=vm, resources=(vm,))


def claim_key(envelope_id: str, vm: str, digest: str) -> str:
    """The idempotency key of one VM's report: the envelope id is the same for every VM of an event,
    and the digest of the message as sent tells a forgery carrying the same id and a proof that
    passed (a ground Azure key) from the genuine report, so the one that came first never makes the
    other a duplicate. A redelivery or a republish of the outbox is byte-identical: a duplicate."""
    return hashlib.sha256(f"{envelope_id}|{vm}|{digest}".encode()).hexdigest()
