"""StateStore and AuditLog on Azure Table Storage (azure-data-tables); same contract as the SQLite store.

Layout: two tables.

The state table (default `mbridgestate`) keeps each concern in its own partitions:

=====================  ==========================  ==============  ==========================================
concern                PartitionKey                RowKey          properties
=====================  ==========================  ==============  ==========================================
idempotency claims     ``claims``                  envelope id     state, lease_until, updated_at (epoch s)
budget of a pool       ``budget``                  pool            reservations: JSON {event key: [VMs]},
                                                                   tokens: JSON {event key: token},
                                                                   terms: JSON {event key: [admitted_at,
                                                                   expires_at]} (epoch s; absent before
                                                                   expiries: see ``_Budget.swept``),
                                                                   alone: JSON [event keys admitted by a
                                                                   report naming only its own VM, not
                                                                   joined since] (absent before)
VMs joining an event   ``joins:<pool>``            [event, VM]     event_key, vm, token
drains of an event     ``drain:<event key>``       VM              event_key, vm, memento (JSON)
ends of an event       ``drain:<event key>``       ``%end:<VM>``   value (binary): how it ended for the VM
                                                   ``%mark:<VM>``  none: an end or a drain was here (ends.py)
remembered values      ``remembered``              key             value (binary): command bytes, proofs seen
waits for the budget   ``parked:<pool>``           event key       event_key, envelope (binary), parked_at
=====================  ==========================  ==============  ==========================================

Atomicity comes from ETags, never from locks: a claim is created once (409 on a duplicate) and
taken over only with If-Match on the expired lease; a pool's reservations live in ONE entity
updated read-modify-write with If-Match, so two invocations can never both take the last slot
(the loser's write fails with 412, it re-reads and sees the pool full).

An event's end for a VM lives beside the event's drains (ends.py): a step reads its end and its drain
records in one query, records a drain with its end check in one transaction (the VM's mark, created
with the record, fails it when an end came first), and an end writes its value and the mark in one.
Ends kept in ``remembered`` by earlier versions are still read while one was written lately.

Every VM of an admitted event joins its reservation with its own report, all at about the same
time: each join is an entity of its own (its RowKey the JSON pair [event key, VM], escaped), one
upsert that meets no other, and the pool's entity is read again after it, so a join of an event
that let its slot go meanwhile is deleted and the event admitted afresh. Admitting another event
counts the joins of the reservations it finds (one query of the pool's joins partition); a join
counts only with the token of the admission it joined, so one a crash left behind after its
event's release never counts for a later admission. A release deletes its joins after the
reservation, unless the event is still listed in ``alone``: a VM that joins such an event takes it
off that list (If-Match on the pool's entity) before it writes its join.

The audit table (default `mbridgeaudit`): PartitionKey = VM name, RowKey = inverted write time
in nanoseconds + a uuid, so a partition lists a VM's records newest first (the portal and
`$top` show the latest). `TableAuditLog.query` returns records oldest first, in write order, like
the SQLite log. `event_id_lower` makes the event query case-insensitive (Azure EventIds are
upper case in IMDS and lower case in envelope ids).

Keys are escaped: '/', '\\', '#', '?' are not allowed in Table keys, nor are control characters;
they and the escape character '%' are written as %XX. Values stay readable in properties. A key
holds at most 1 KiB: a longer one (an audit record naming many VMs) keeps its first 200
characters and the SHA-256 of the whole, after `%~`, which no escaped value contains.

Sizes: a property holds at most 64 KiB (text: 32K UTF-16 characters), an entity 1 MiB. A value
whose size comes from the input — a pool's reservations, a memento, a remembered value, an
envelope waiting for the budget — is written as it always was when it fits one property, and
otherwise as its UTF-8 bytes in pieces of 64 KiB: `<name>`, `<name>_1`, ... (`<name>_pieces`
counts them), at most 640 KiB in all. A pool whose reservations would outgrow that admits no
further event until one lets its slot go: the event waits, as for a budget. Audit records are
small by construction (`AuditRecord` cuts its texts). Nothing expires by itself: claims,
remembered commands and audit rows accumulate like in the SQLite store.
"""

from functions.azure_app.tables.audit_log import TableAuditLog
from functions.azure_app.tables.entities import escape_key
from functions.azure_app.tables.errors import (
    TABLE_ROLE,
    TableStorageConfigError,
    TableStorageUnavailableError,
    TableValueTooLargeError,
    table_errors,
)
from functions.azure_app.tables.state_store import TableStateStore
from functions.core.store_rules import BUDGET_ATTEMPTS

__all__ = [
    "BUDGET_ATTEMPTS",
    "TABLE_ROLE",
    "TableAuditLog",
    "TableStateStore",
    "TableStorageConfigError",
    "TableStorageUnavailableError",
    "TableValueTooLargeError",
    "escape_key",
    "table_errors",
]
