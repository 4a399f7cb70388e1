"""What a message must be before anything is begun for it: nothing is begun that cannot be carried
through. An event is checked, before it is claimed, for every text its actions will put into a
command, a store key or a bus attribute; one that fails is malformed, like an envelope the decoder
refuses — a name no approval can be addressed to must not be found after its VMs are drained.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime

from functions.core.invocation import Deps
from functions.core.ports import ActionName, AuditKind, AuditRecord
from wire.bounds import MAX_ENVELOPE_BYTES, MAX_RESOURCES, bounded
from wire.commands import MalformedCommandError, check_event_id, check_target
from wire.envelope import Envelope, decode
from wire.errors import MalformedEnvelopeError
from wire.model import MaintenanceEvent

LOGGER = logging.getLogger("mbridge.functions")


def decode_actionable(body: bytes) -> Envelope:
    """The envelope of a message body, if everything its actions need can be carried through.

    Raises:
        MalformedEnvelopeError: the decoder refuses it, or it is larger than a bus message, or it
            is an event with more VMs than a scale set holds, or a VM name or event id that no
            command can carry (the checks of the command codec itself, so none can fail later).
    """
    if len(body) > MAX_ENVELOPE_BYTES:
        raise MalformedEnvelopeError(
            f"the message body is {len(body)} bytes; an envelope is at most {MAX_ENVELOPE_BYTES}"
        )
    envelope = decode(body)
    if isinstance(envelope.data, MaintenanceEvent):
        _check_actionable(envelope.data)
    return envelope


def _check_actionable(event: MaintenanceEvent) -> None:
    """Every VM an action may drain, approve through, restore or start maintenance on, and the event
    id every command and store key carries, as commands require them."""
    if len(event.resources) > MAX_RESOURCES:
        raise MalformedEnvelopeError(
            f"data.resources lists {len(event.resources)} VMs; at most {MAX_RESOURCES} (no scale set holds more)"
        )
    try:
        check_event_id(event.event_id, "data.event_id")
        check_target(event.reporter, "data.reporter")
        for index, vm in enumerate(event.resources):
            check_target(vm, f"data.resources[{index}]")
    except MalformedCommandError as exc:
        raise MalformedEnvelopeError(f"{exc}: no command could carry it, so nothing is done for this event") from exc


def audit_malformed(body: bytes, error: MalformedEnvelopeError, deps: Deps, now: datetime) -> str:
    """Record a message that is not acted on, under the digest of its body (it has no usable id)."""
    record = malformed_record(body, error, now)
    deps.audit.append(record)
    return record.envelope_id


def malformed_record(body: bytes, error: MalformedEnvelopeError, now: datetime) -> AuditRecord:
    """The audit record of a message that is not acted on (logged as it is made), under the digest of
    its body (it has no usable id)."""
    digest = hashlib.sha256(body).hexdigest()
    LOGGER.warning("malformed envelope %s acknowledged: %s", digest[:16], bounded(str(error)))
    return AuditRecord(now, AuditKind.MALFORMED, digest, "", "", action=ActionName.NONE, reason=str(error))
