"""The fleet's maintenance as the audit log tells it: one row per (VM, event), each column read from
the records the core writes (`mbridge fleet`, docs/operations.md#the-fleet-view).

- **source**: who reported the event for the VM: its own agent (a record of kind `event` whose
  sender is the VM), the control plane (a sender starting with `central.SENDER_PREFIX`), or both.
  Refused reports (`unverified`, `not-self`) and duplicates report nothing.
- **drained**: `no`; `waiting` (for a budget slot, action `wait`); `yes` (action `drain`);
  `restored` (action `restore`, or an operator's `mbridge recover`); `restore-failed` (action
  `restore_failed` and no restore since: the VM is still out); `dry-run` (policy dry run: nothing
  was taken out).
- **approved**: the event's approval, which Azure applies to every VM the event names: `sent`
  (action `approve`), then the agent's answer `accepted` or `rejected` (a `command-result`);
  `dry-run`; `performed` for a GCE maintenance started on the VM (`perform_maintenance`).
- **ended**: the VM's part ended: the first `completed` or `canceled` reported for it, or
  `recovered` when an operator put the VM back by hand before any end was seen.
- **silent**: the control plane reported it and the sweep found the VM's agent silent (`agent-silent`).

Rows are built from the records given (a window of the log): an event whose first report is older
than the window shows what the window holds (its NotBefore is on the record of a report).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime

from functions.core.central import SENDER_PREFIX
from functions.core.ports import ActionName, AuditKind, AuditRecord
from wire.model import EventStatus
from wire.timefmt import parse_rfc3339

DRY_RUN = "dry run:"  # how the core's reason begins for what the dry run did not do
ENDS = (EventStatus.COMPLETED.value, EventStatus.CANCELED.value)
RECOVERED = "recovered"
# The order of the steps of an event: the row's status is the furthest one reported.
_STEPS = {status.value: order for order, status in enumerate(EventStatus)}
# Records that make a row: the reports and what the core did about the VM's part.
_OPENING = {AuditKind.EVENT.value, AuditKind.AGENT_SILENT.value}
_OWN_ACTIONS = {
    ActionName.DRAIN.value,
    ActionName.WAIT.value,
    ActionName.APPROVE.value,
    ActionName.RESTORE.value,
    ActionName.RESTORE_FAILED.value,
    ActionName.PERFORM_MAINTENANCE.value,
}


@dataclass
class FleetRow:
    """One VM's part of one event, as far as the records read tell it."""

    vm: str
    event_id: str
    cloud: str = ""
    kind: str = ""
    not_before: datetime | None = None
    status: str = ""  # the furthest step reported: scheduled, started, completed, canceled
    agent: bool = False
    centre: bool = False
    drained: str = "no"
    performed: bool = False
    ended: str = ""
    silent: bool = False
    last: datetime | None = None  # the time of the last record read about it

    @property
    def source(self) -> str:
        return "both" if self.agent and self.centre else "centre" if self.centre else "agent" if self.agent else ""


@dataclass(frozen=True)
class FleetView:
    """The rows, by NotBefore (none last), VM and event; and each event's approval (`approval`)."""

    rows: tuple[FleetRow, ...]
    approvals: dict[str, str]

    def approval(self, row: FleetRow) -> str:
        """The approval of the row's event (Azure starts an approved event for all its VMs), or that
        its GCE maintenance was started on the VM."""
        return self.approvals.get(row.event_id.lower(), "performed" if row.performed else "")


def fleet_view(records: Iterable[AuditRecord]) -> FleetView:
    """The rows of the records, read oldest first."""
    rows: dict[tuple[str, str], FleetRow] = {}
    approvals: dict[str, str] = {}
    for record in records:
        key = (record.vm, record.event_id.lower())
        row = rows.get(key)
        if row is None:
            if not record.vm or not record.event_id or not _opens(record):
                if record.kind == AuditKind.COMMAND_RESULT and key[1] in approvals:
                    approvals[key[1]] = record.action  # accepted | rejected
                continue
            row = rows[key] = FleetRow(record.vm, record.event_id)
        _read(row, record, approvals)
    ordered = sorted(rows.values(), key=lambda row: (row.not_before is None, row.not_before, row.vm, row.event_id))
    return FleetView(tuple(ordered), approvals)


def _opens(record: AuditRecord) -> bool:
    return record.kind in _OPENING or (record.kind == AuditKind.ACTION and record.action in _OWN_ACTIONS)


def _read(row: FleetRow, record: AuditRecord, approvals: dict[str, str]) -> None:
    detail = record.detail
    row.last = record.time
    row.kind = str(detail.get("kind") or row.kind)
    row.cloud = str(detail.get("cloud") or row.cloud)
    if record.kind == AuditKind.EVENT:
        _report(row, record)
    elif record.kind == AuditKind.AGENT_SILENT:
        row.silent = True
    elif record.kind == AuditKind.ACTION:
        _action(row, record, approvals)
    elif record.kind == AuditKind.COMMAND_RESULT and row.event_id.lower() in approvals:
        approvals[row.event_id.lower()] = record.action  # accepted | rejected
    elif record.kind == AuditKind.RECOVERY and record.action == ActionName.RESTORE:
        row.drained = "restored"
        row.ended = row.ended or RECOVERED


def _report(row: FleetRow, record: AuditRecord) -> None:
    if str(record.detail.get("sender", "")).startswith(SENDER_PREFIX):
        row.centre = True
    else:
        row.agent = True
    if _STEPS.get(record.status, -1) > _STEPS.get(row.status, -1):
        row.status = record.status
    if record.status in ENDS and row.ended in ("", RECOVERED):
        row.ended = record.status  # the first end reported is the one kept (`lifecycle.mark_ended`)
    reported = record.detail.get("not_before")
    if isinstance(reported, str):
        with suppress(ValueError):  # not a time: the column stays as it was
            row.not_before = parse_rfc3339(reported)


def _action(row: FleetRow, record: AuditRecord, approvals: dict[str, str]) -> None:
    action, dry = record.action, record.reason.startswith(DRY_RUN)
    if action == ActionName.WAIT and row.drained == "no":
        row.drained = "waiting"
    elif action == ActionName.DRAIN:
        row.drained = "dry-run" if dry else "yes"
    elif action == ActionName.RESTORE and not dry:
        row.drained = "restored"
    elif action == ActionName.RESTORE_FAILED:
        row.drained = "restore-failed"
    elif action == ActionName.APPROVE:
        approvals[row.event_id.lower()] = "dry-run" if dry else "sent"
    elif action == ActionName.PERFORM_MAINTENANCE and not dry:
        row.performed = True
