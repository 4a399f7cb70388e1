"""The AuditLog port on Firestore: `<prefix>audit/{time-ordered id}` documents holding the audit
codec's fields, with times as Firestore timestamps (the console shows them as times),
`event_id_lower` for queries by event in any case, and `recorded_at`, the server's commit time."""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from google.cloud import firestore

from functions.core.audit_codec import (
    ALSO_NAMED,
    EVENT_ID_LOWER,
    also_named,
    audit_fields,
    audit_record,
    event_id_lower,
    names,
)
from functions.core.ports import AuditRecord, Finishing
from functions.gcp_app.firestore_store import DEFAULT_PREFIX, firestore_errors, plain_utc
from wire.timefmt import format_rfc3339, parse_rfc3339

_MOST_PER_COMMIT = 500  # writes in one Firestore commit


class FirestoreAuditLog:
    """The append-only audit log on Firestore, queryable by VM and by event id.

    Records come back in the order they were written: by `recorded_at` (Firestore's commit time)
    and, for writes within the same tick, by document id, which starts with this process's
    nanosecond clock and a counter (Firestore orders equal values by document id). The write
    rate of this log is a few documents per second, far below where sequential ids would make
    a hot spot.
    """

    def __init__(self, client: firestore.Client, *, prefix: str = DEFAULT_PREFIX, database: str = "(default)") -> None:
        self._client = client
        self._collection = client.collection(f"{prefix}audit")
        self._database = database
        self._counter = itertools.count()

    def append(self, record: AuditRecord) -> None:
        self.append_all([record])

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        """One commit (of at most 500 writes) holds them all: they share its commit time,
        `recorded_at`, and keep their order by document id. The end of the message in the state
        store (`then`) goes in the last commit when the store is on this client and it fits, so the
        records and the claim's completion are written together or not at all; else it is written
        once they are."""
        offered = getattr(then, "writes", None)  # a FirestoreFinish, or a wrapper that lends its writes
        folded = offered(self._client) if callable(offered) else None
        with firestore_errors(self._database, "append to the audit log"):
            starts = list(range(0, len(records), _MOST_PER_COMMIT)) or [0]
            for start in starts:
                batch = self._client.batch()
                for reference, document in self.documents(records[start : start + _MOST_PER_COMMIT]):
                    batch.create(reference, document)
                if start == starts[-1] and folded is not None and len(batch) + len(folded) <= _MOST_PER_COMMIT:
                    for kind, reference, fields in folded:
                        if kind == "delete":
                            batch.delete(reference)
                        else:
                            batch.set(reference, fields or {}, merge=True)
                    then = None  # written with the records
                if len(batch):
                    batch.commit()
        if then is not None:
            then.write()

    def documents(self, records: Sequence[AuditRecord]) -> list[tuple[firestore.DocumentReference, dict[str, Any]]]:
        """Where each record goes and what it holds, in order, for a commit (this log's or a store's)."""
        return [(self._collection.document(self._next_id()), _document(record)) for record in records]

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        query: Any = self._collection
        if vm is not None:
            query = query.where(filter=firestore.FieldFilter("vm", "==", vm))
        if event_id is not None:
            query = query.where(filter=firestore.FieldFilter(EVENT_ID_LOWER, "==", event_id_lower(event_id)))
        # With a filter this needs a composite index (docs/gcp.md); its last key, the document
        # id, is Firestore's own tie-breaker.
        query = query.order_by("recorded_at")
        with firestore_errors(self._database, "query the audit log"):
            return [_audit_record(snapshot.to_dict() or {}) for snapshot in query.stream()]

    def query_naming(self, vm: str, *, event_id: str | None = None) -> Sequence[AuditRecord]:
        """The records that name `vm` (audit_codec.names), of one event or all, oldest first.

        With an event: that event's records (its index), those that name the VM kept. Without: the
        records filed under the VM (the index of the queries by VM) and those filed under another VM
        that name it in `also_named` (an array Firestore indexes by itself, so no composite index;
        put in order here), each read once. Records written before `also_named` was are found under
        the VM they are filed under only."""
        if event_id is not None:
            return [record for record in self.query(event_id=event_id) if names(record, vm)]
        filed = self._collection.where(filter=firestore.FieldFilter("vm", "==", vm)).order_by("recorded_at")
        named = self._collection.where(filter=firestore.FieldFilter(ALSO_NAMED, "array_contains", vm))
        with firestore_errors(self._database, "query the audit log"):
            snapshots = [*filed.stream(), *named.stream()]
        # Firestore's own order: by commit time, then by document id.
        snapshots.sort(key=lambda snapshot: (snapshot.get("recorded_at"), snapshot.id))
        return [_audit_record(snapshot.to_dict() or {}) for snapshot in snapshots]

    def query_trace(self, trace_id: str) -> Sequence[AuditRecord]:
        """The records of one trace, oldest first (`mbridge audit list --trace`): served by the
        single-field index Firestore keeps on `trace_id` by itself (no composite index, so no
        `order_by`: the few records of one trace are put in order here, as `query_naming` does)."""
        query = self._collection.where(filter=firestore.FieldFilter("trace_id", "==", trace_id))
        with firestore_errors(self._database, "query the audit log"):
            snapshots = list(query.stream())
        snapshots.sort(key=lambda snapshot: (snapshot.get("recorded_at"), snapshot.id))
        return [_audit_record(snapshot.to_dict() or {}) for snapshot in snapshots]

    def query_since(self, since: datetime, *, most: int, vm: str | None = None) -> Sequence[AuditRecord]:
        """The records written from `since` on (by `recorded_at`, the commit time), oldest first, at most
        `most` of them: a view of the whole log that reads only what it shows (`mbridge fleet`). By
        VM it is served by the composite index of the queries by VM (docs/gcp.md); without, by the
        single-field index Firestore keeps on `recorded_at`."""
        query: Any = self._collection.where(filter=firestore.FieldFilter("recorded_at", ">=", since))
        if vm is not None:
            query = query.where(filter=firestore.FieldFilter("vm", "==", vm))
        query = query.order_by("recorded_at").limit(max(0, most))
        with firestore_errors(self._database, "query the audit log"):
            return [_audit_record(snapshot.to_dict() or {}) for snapshot in query.stream()]

    def _next_id(self) -> str:
        return f"{time.time_ns():020d}-{next(self._counter) % 1_000_000:06d}-{secrets.token_hex(4)}"


def _document(record: AuditRecord) -> dict[str, Any]:
    fields = audit_fields(record)
    others = also_named(record)
    return {
        **fields,
        # Times as timestamps, at the codec's millisecond precision; no `at` is null.
        "time": _timestamp(fields["time"]),
        "at": _timestamp(fields["at"]),
        EVENT_ID_LOWER: event_id_lower(record.event_id),
        "recorded_at": firestore.SERVER_TIMESTAMP,
        # Only where there are any: most records name their own VM alone, and an array is indexed.
        **({ALSO_NAMED: list(others)} if others else {}),
    }


def _audit_record(document: Mapping[str, Any]) -> AuditRecord:
    return audit_record({**document, "time": _text(document["time"]), "at": _text(document.get("at"))})


def _timestamp(text: str) -> datetime | None:
    """A time of the audit codec as a Firestore timestamp (so the console shows it as a time)."""
    return parse_rfc3339(text) if text else None


def _text(moment: datetime | None) -> str:
    """A Firestore timestamp of an audit record as the audit codec's text."""
    return format_rfc3339(plain_utc(moment)) if moment else ""
