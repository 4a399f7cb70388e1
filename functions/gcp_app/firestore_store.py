"""The Firestore implementation of the StateStore port (docs/architecture.md#the-functions), on
google-cloud-firestore. They behave as the SQLite store of functions/local_app/store.py does.

Collections (each name starts with a prefix, `mbridge_` by default, so that two deployments
can share one database):

    claims/{h(key)}            key, state (in-progress | done), lease_until, updated_at, expire_at
    budget_pools/{h(pool)}     pool, reservations: [{event_key, vms, token, admitted_at, expires_at, alone}]
                               one document per pool; the times in seconds since the epoch
      joins/{h(event_key, vm)} event_key, vm, token: a VM that joined an admitted event
    drains/{h(event_key, vm)}  event_key, vm, memento (JSON text)       one document per drained VM
    remembered/{h(key)}        key, value (bytes): command bytes, event ends
    parked/{h(pool, key)}      pool, event_key, envelope (bytes), parked_at
    audit/{time-ordered id}    the audit log: functions/gcp_app/firestore_audit.py

Document ids are SHA-256 hex digests of the keys (envelope ids, "azure:<guid>", pool and VM
names may hold '/' or other characters Firestore refuses in ids); the keys themselves are kept
as fields for people reading the console.

Sizes: a document holds at most 1 MiB. A drain is a document of its own, as an event's VMs and
their mementos together may be more than that (1,000 VMs in many backend pools); earlier versions
kept an event's drains in one document, `drains/{h(event_key)}` with a map `vms`, which is still
read and forgotten from. A pool's reservations stay in one document, whose conditional write
admits an event; when one more event would not fit, it waits for a slot as for a budget (an event
alone always fits).

Every VM of an admitted event joins its reservation with its own report, all at about the same
time: each join is a document of its own under the pool's (one write that meets no other), and
the pool's document is read again after it, so a join of an event that let its slot go meanwhile
is taken back and the event admitted afresh. Admitting another event counts the joins of the
reservations it finds; a join counts only with the token of the admission it joined, so one a
crash left behind after its event's release never counts for a later admission.

An envelope waiting for the budget is at most 256 KiB (`MAX_ENVELOPE_BYTES`), a remembered value
a command or an event's end, and audit records cut their texts.

Every method is atomic on its own: single-document writes (`create`, `update`, `delete`) are
atomic in Firestore, and every read-modify-write is a read followed by a write conditional on the
document being as it was read (`create` when it was absent, else its update time as a
precondition), applied again to what is there when another invocation wrote it meanwhile. The
whole budget of a pool is one document, so two events racing for its last slot are serialised by
that document and never both admitted. Round trips: a claim is one `create` (a duplicate: two);
completing it one `update`; admitting an event a read and a write, plus a query of the joins
when the pool holds other events; a join two reads and a write; a release a read, a write and a
query of its joins (and one batch to delete them; no query for a reservation admitted alone). A
reservation found expired (or written by an earlier version, without an expiry) costs the
admission that finds it one more write, also when the event waits, and a query of its joins: rare,
never on the common path. Completing a claim is in the commit of the message's audit records
(`FirestoreFinish`) when the audit log is on the same client. What a step reads before it acts
(`glance`: its end, its VMs' drains, its pools' budget documents) is one `BatchGetDocuments`, and
the budget document read there is `reserve`'s first read (its write stays conditional on it). A
drain is recorded removed in a commit whose precondition is that the event's end is not remembered
(`record_drain_unless`): a delete of the end's document with `exists: false`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors
from google.cloud import firestore

from functions.core import store_rules
from functions.core.ports import Admission, Claim, Finishing, Glance, JsonObject, Parked, RecordedDrain, Reservation
from functions.core.store_rules import (
    DONE,
    IN_PROGRESS,
    admits,
    claim_found,
    has_expired,
    in_line,
    joined,
    legacy_expiry,
)
from wire.errors import BridgeError, PermanentError, RetryableError

LOGGER = logging.getLogger("mbridge.gcp.firestore")

DEFAULT_PREFIX = "mbridge_"
DATASTORE_ROLE = "roles/datastore.user"
# Claims carry `expire_at` for an optional Firestore TTL policy (docs/gcp.md). A claim must
# outlive every redelivery of its envelope: Pub/Sub keeps a message at most 7 days, and an agent
# republishes only events that are still current.
CLAIM_RETENTION = timedelta(days=30)
# The most a pool's reservations take as JSON (which counts more than Firestore does: quotes,
# commas), below the 1 MiB of a document: room for its name and other fields.
RESERVATIONS_BYTES = 900 * 1024
# The most writes one batch commit takes.
_BATCH_WRITES = 500
# How many events the store remembers having read without a drains document of the earlier layout.
_REMEMBERED_EVENTS = 10_000

_RETRYABLE = (
    api_errors.Aborted,  # transaction contention the library's own attempts did not resolve
    api_errors.ServiceUnavailable,
    api_errors.DeadlineExceeded,
    api_errors.GatewayTimeout,
    api_errors.TooManyRequests,
    api_errors.ResourceExhausted,
    api_errors.InternalServerError,
    api_errors.Unknown,
    api_errors.RetryError,  # the library's own retries ran out of time
    auth_errors.TransportError,  # the metadata server could not be reached for a token
)
# What a conditional write raises when the document changed since it was read: its update time no
# longer matches (FailedPrecondition), it was created (AlreadyExists) or deleted (NotFound) meanwhile.
_CHANGED_MEANWHILE = (api_errors.FailedPrecondition, api_errors.AlreadyExists, api_errors.NotFound)
_CREDENTIALS = (api_errors.Unauthenticated, auth_errors.DefaultCredentialsError, auth_errors.RefreshError)


class FirestoreUnavailableError(RetryableError):
    """Firestore cannot be reached or is contended right now; the message is redelivered."""


class FirestoreConfigError(PermanentError):
    """Firestore refused the operation for a reason retrying cannot fix; the message says what to set."""


def doc_id(*parts: str) -> str:
    """A document id for a key: hex SHA-256 (no '/', fixed length, never a reserved `__x__` id)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


@contextmanager
def firestore_errors(database: str, action: str) -> Iterator[None]:
    """Translate library errors into RetryableError / PermanentError naming what to do."""
    try:
        yield
    except BridgeError:
        raise
    except api_errors.Forbidden as error:  # PermissionDenied (gRPC) is a Forbidden (HTTP 403)
        raise FirestoreConfigError(
            f"not allowed to {action} in Firestore database {database}: grant {DATASTORE_ROLE} on it to the "
            f"function's service account: {error}"
        ) from error
    except api_errors.NotFound as error:
        raise FirestoreConfigError(
            f"Firestore database {database} was not found while trying to {action}: create it (Native mode) or "
            f"set MBRIDGE_FIRESTORE_DATABASE / MBRIDGE_GCP_PROJECT: {error}"
        ) from error
    except api_errors.FailedPrecondition as error:
        raise FirestoreConfigError(
            f"Firestore refused to {action} in database {database}; a query without its composite index fails "
            f"this way: create the indexes listed in docs/gcp.md: {error}"
        ) from error
    except _CREDENTIALS as error:
        raise FirestoreConfigError(
            f"Google credentials were missing or rejected while trying to {action} in Firestore: attach a service "
            f"account to the function, or set FIRESTORE_EMULATOR_HOST for the emulator: {error}"
        ) from error
    except _RETRYABLE as error:
        raise FirestoreUnavailableError(f"cannot {action} in Firestore database {database} now: {error}") from error
    except ValueError as error:
        # A transaction that kept colliding with other writers: the library gives up with a
        # ValueError caused by Aborted. Any other ValueError is a bug and propagates as is.
        if isinstance(error.__cause__, api_errors.Aborted):
            raise FirestoreUnavailableError(
                f"cannot {action} in Firestore database {database} now: too much contention ({error})"
            ) from error
        raise
    except api_errors.GoogleAPICallError as error:
        raise FirestoreConfigError(f"Firestore refused to {action} in database {database}: {error}") from error


def plain_utc(moment: datetime) -> datetime:
    """A plain aware UTC datetime (Firestore returns its own subclass with nanoseconds)."""
    utc = moment.astimezone(timezone.utc)
    return datetime(
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=timezone.utc
    )


# ---------------------------------------------------------------- budget documents


def _entries(snapshot: firestore.DocumentSnapshot[firestore.DocumentReference]) -> list[JsonObject]:
    """A pool's reservations as read: [{event_key, vms, token}], in the order they were admitted.
    Entries written before tokens have none: their token is ""."""
    return list((snapshot.to_dict() or {}).get("reservations", [])) if snapshot.exists else []


def _entry(entries: Sequence[JsonObject], event_key: str) -> JsonObject | None:
    return next((entry for entry in entries if entry["event_key"] == event_key), None)


def _swept(entries: Sequence[JsonObject], now: datetime) -> tuple[list[JsonObject], list[tuple[Reservation, str]]]:
    """The reservations that still count at `now`, an expiry given to those an earlier version wrote
    without one (`legacy_expiry`), and those that expired, each with its token (for its joins)."""
    live: list[JsonObject] = []
    expired: list[tuple[Reservation, str]] = []
    for entry in entries:
        if entry.get("expires_at") is None:
            entry = {**entry, "expires_at": legacy_expiry(now).timestamp()}
        expires_at = datetime.fromtimestamp(entry["expires_at"], timezone.utc)
        if not has_expired(expires_at, now):
            live.append(entry)
            continue
        admitted = entry.get("admitted_at")
        admitted_at = None if admitted is None else datetime.fromtimestamp(admitted, timezone.utc)
        held = Reservation(entry["event_key"], tuple(entry["vms"]), admitted_at, expires_at)
        expired.append((held, entry.get("token", "")))
    return live, expired


def _read_budget(
    ref: firestore.DocumentReference,
    event_key: str,
    seen: firestore.DocumentSnapshot[firestore.DocumentReference] | None = None,
) -> tuple[firestore.DocumentSnapshot[firestore.DocumentReference], list[JsonObject], JsonObject | None]:
    """The pool's document as read now (or as `seen`, read a moment ago), its reservations, and the
    event's among them (None: not admitted)."""
    snapshot = seen if seen is not None else ref.get()
    entries = _entries(snapshot)
    return snapshot, entries, _entry(entries, event_key)


def _unique(references: Sequence[firestore.DocumentReference]) -> list[firestore.DocumentReference]:
    """Each document once, in order (a batched read returns one snapshot per document)."""
    return list({reference.path: reference for reference in references}.values())


# ---------------------------------------------------------------- transactions
# Module-level functions: `firestore.transactional` re-runs the whole function when the commit
# is aborted by a concurrent writer, so each must read everything it decides on through `transaction`.


@firestore.transactional
def _forget_earlier_drain(transaction: firestore.Transaction, ref: firestore.DocumentReference, vm: str) -> None:
    """Remove one VM from an event's drains as earlier versions kept them (one document, `vms`)."""
    snapshot = ref.get(transaction=transaction)
    vms: dict[str, str] = dict((snapshot.to_dict() or {}).get("vms", {})) if snapshot.exists else {}
    if vms.pop(vm, None) is None:
        return
    if vms:
        transaction.update(ref, {"vms": vms})
    else:
        transaction.delete(ref)


# ---------------------------------------------------------------- the end of a message

# One write of a commit: ("delete", document, None) or ("merge", document, fields).
_Write = tuple[str, firestore.DocumentReference, "dict[str, Any] | None"]


def _done(now: datetime) -> dict[str, Any]:
    """A completed claim's fields."""
    return {"state": DONE, "updated_at": now, "expire_at": now + CLAIM_RETENTION}


class FirestoreFinish:
    """`FirestoreStateStore.finishing`: the claim's completion and the drains forgotten, written in the
    commit of the message's audit records by a `FirestoreAuditLog` on the same client (`writes`), or
    on their own (`write`)."""

    def __init__(
        self, store: FirestoreStateStore, key: str, now: datetime, forgotten: tuple[tuple[str, str], ...]
    ) -> None:
        self.key, self.now, self.forgotten = key, now, forgotten
        self._store = store

    def writes(self, client: firestore.Client) -> list[_Write] | None:
        return self._store.folded_writes(self, client)

    def write(self) -> None:
        for event_key, vm in self.forgotten:
            self._store.forget_drain(event_key, vm)
        self._store.complete(self.key, self.now)


# ---------------------------------------------------------------- the ports


class FirestoreStateStore:
    """StateStore on Firestore: idempotency claims, budget reservations, drains, remembered
    values (command bytes, event ends) and budget waits."""

    def __init__(self, client: firestore.Client, *, prefix: str = DEFAULT_PREFIX, database: str = "(default)") -> None:
        self._client = client
        self._database = database
        self._claims = client.collection(f"{prefix}claims")
        self._pools = client.collection(f"{prefix}budget_pools")
        self._drains = client.collection(f"{prefix}drains")
        self._remembered = client.collection(f"{prefix}remembered")
        self._parked = client.collection(f"{prefix}parked")
        # Events whose drains were read and had no document of the earlier one-document layout: as
        # no version writes that layout any more, none can appear later, and forgetting a drain of
        # such an event need not look for it (a completion reads its event's drains first).
        self._no_earlier_drains: dict[str, None] = {}

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return firestore_errors(self._database, action)

    # ---- claims

    def claim(self, key: str, now: datetime, lease: timedelta) -> Claim:
        ref = self._claims.document(doc_id(key))
        fields = {"key": key, "state": IN_PROGRESS, "lease_until": now + lease, "updated_at": now}
        with self._errors("claim envelope " + key):
            try:
                ref.create(fields)  # the common case: first delivery, one round trip
                return Claim.CLAIMED
            except api_errors.AlreadyExists:
                pass
            # A duplicate finds the claim done or busy in one read. Only a lease that ran out is
            # taken over, by a write that fails if anyone wrote the claim since that read.
            snapshot = ref.get()
            current = (snapshot.to_dict() or {}) if snapshot.exists else {}
            lease_until = current.get("lease_until")
            found = claim_found(current.get("state"), lease_until.timestamp() if lease_until else None, now.timestamp())
            if found is not Claim.CLAIMED:
                return found
            try:
                if snapshot.exists:
                    ref.update(fields, option=self._client.write_option(last_update_time=snapshot.update_time))
                else:
                    ref.create(fields)
            except _CHANGED_MEANWHILE:
                return Claim.BUSY  # another invocation took it over first
            return Claim.CLAIMED

    def finishing(self, key: str, now: datetime, forgotten: Sequence[tuple[str, str]] = ()) -> Finishing:
        return FirestoreFinish(self, key, now, tuple(forgotten))

    def folded_writes(self, finish: FirestoreFinish, client: firestore.Client) -> list[_Write] | None:
        """The writes of `finish` for a commit of `client` (the audit log's), or None when they cannot
        go in one: another client (another database), or a drain of an event whose drains this store
        has not read without a document of the earlier one-document layout (see `forget_drain`)."""
        if client is not self._client or any(key not in self._no_earlier_drains for key, _ in finish.forgotten):
            return None
        writes: list[_Write] = [
            ("delete", self._drains.document(doc_id(key, vm)), None) for key, vm in finish.forgotten
        ]
        # A merge rather than an update: an update of a claim that is not there (completed by a
        # test that never claimed it) would fail the whole commit, audit records and all.
        writes.append(("merge", self._claims.document(doc_id(finish.key)), _done(finish.now)))
        return writes

    def complete(self, key: str, now: datetime) -> None:
        fields = _done(now)
        with self._errors("complete the claim of envelope " + key):
            try:
                # `update` writes only an existing document: one round trip, no transaction.
                self._claims.document(doc_id(key)).update(fields)
            except api_errors.NotFound:
                LOGGER.warning("completing envelope %s that was never claimed; nothing recorded", key)

    def abandon(self, key: str, now: datetime) -> None:
        ref = self._claims.document(doc_id(key))
        with self._errors("abandon the claim of envelope " + key):
            snapshot = ref.get()
            if not snapshot.exists or (snapshot.to_dict() or {}).get("state") == DONE:
                return
            try:
                option = self._client.write_option(last_update_time=snapshot.update_time)
                ref.update({"lease_until": now, "updated_at": now}, option=option)
            except _CHANGED_MEANWHILE:
                return  # someone else moved on with it: nothing to give back

    # ---- budget

    def reserve(
        self,
        pool: str,
        event_key: str,
        vms: Sequence[str],
        limit: int | None,
        *,
        now: datetime,
        expires_at: datetime,
        alone: bool = False,
        seen: object | None = None,
    ) -> Admission:
        ref = self._pools.document(doc_id(pool))
        found: list[Reservation] = []  # expired reservations this call removed
        # The pool's document as `glance` read it: the first read, a guess that the writes below check.
        guess = seen if isinstance(seen, firestore.DocumentSnapshot) and seen.reference.path == ref.path else None
        with self._errors(f"reserve budget in pool {pool}"):
            for attempt in range(store_rules.BUDGET_ATTEMPTS):
                snapshot, read, _ = _read_budget(ref, event_key, guess)
                guessed, guess = snapshot is guess, None
                entries, expired = _swept(read, now)
                swept = entries != read
                held = _entry(entries, event_key)
                if held is not None:
                    if swept:
                        if not self._write_budget(ref, snapshot, pool, entries):
                            time.sleep(store_rules.budget_backoff(attempt))
                            continue
                        found += self._forget_expired(ref, expired)
                    if self._join(ref, snapshot if not swept else None, pool, entries, held, vms):
                        return Admission(True, tuple(found))
                    continue  # the event let its slot go meanwhile: admit it afresh
                counted = [entry["vms"] for entry in entries]
                # Reservations still marked alone have no joins (a join takes the mark off first, in
                # a write this one's would then fail on): the joins are queried only past them.
                if limit is not None and entries and not all(entry.get("alone") for entry in entries):
                    counted = self._with_joins(ref, entries)
                entry = {
                    "event_key": event_key,
                    "vms": list(vms),
                    "token": uuid.uuid4().hex,
                    "admitted_at": now.timestamp(),
                    "expires_at": expires_at.timestamp(),
                    # Admitted alone (see `StateStore.reserve`): its release looks for no joins until one comes.
                    **({"alone": True} if alone else {}),
                }
                admitted = [*entries, entry] if admits(counted, vms, limit) else entries
                if entries and admitted is not entries and len(json.dumps(admitted).encode()) > RESERVATIONS_BYTES:
                    # The pool's document is full: the event waits for a slot as for a budget.
                    LOGGER.warning("the reservations of pool %s fill their document: %s waits", pool, event_key)
                    admitted = entries
                if admitted is entries and not swept:
                    if guessed:
                        continue  # a refusal is decided on a fresh read, not on the guess
                    return Admission(False, tuple(found))
                # Written also when the event waits, if it found reservations expired (or of an earlier
                # version): their removal (or expiry) is then on record, and reported by this call only.
                if self._write_budget(ref, snapshot, pool, admitted):
                    found += self._forget_expired(ref, expired)
                    return Admission(admitted is not entries, tuple(found))
                time.sleep(store_rules.budget_backoff(attempt))
        raise FirestoreUnavailableError(
            f"the budget of pool {pool!r} changed under {store_rules.BUDGET_ATTEMPTS} attempts to reserve a slot; "
            "retry later"
        )

    def release(self, pool: str, event_key: str) -> None:
        ref = self._pools.document(doc_id(pool))
        with self._errors(f"release budget in pool {pool}"):
            for attempt in range(store_rules.BUDGET_ATTEMPTS):
                snapshot, entries, held = _read_budget(ref, event_key)
                if held is None:
                    return
                if self._write_budget(ref, snapshot, pool, [entry for entry in entries if entry is not held]):
                    break
                time.sleep(store_rules.budget_backoff(attempt))
            else:
                raise FirestoreUnavailableError(
                    f"the budget of pool {pool!r} changed under {store_rules.BUDGET_ATTEMPTS} attempts to release "
                    "a slot; retry later"
                )
            # Its joins only now: until the reservation is gone they count. (A redelivered release
            # that finds the reservation gone leaves any join a crash left: it counts for nothing,
            # as its reservation's token is no pool's any more.) A reservation still marked as
            # admitted alone has none: a join takes the mark off before it is written.
            if not held.get("alone"):
                self._forget_joins(ref, event_key, held.get("token", ""))

    def _forget_joins(self, ref: firestore.DocumentReference, event_key: str, token: str) -> None:
        query = ref.collection("joins").where(filter=firestore.FieldFilter("event_key", "==", event_key))
        batch = self._client.batch()
        for join in query.stream():
            if (join.to_dict() or {}).get("token", "") == token:
                batch.delete(join.reference)
            if len(batch) == _BATCH_WRITES:
                batch.commit()
                batch = self._client.batch()
        if len(batch):
            batch.commit()

    def _forget_expired(
        self, ref: firestore.DocumentReference, expired: Sequence[tuple[Reservation, str]]
    ) -> list[Reservation]:
        """The joins of reservations just removed as expired (they would count for nothing, but stay)."""
        for held, token in expired:
            self._forget_joins(ref, held.event_key, token)
        return [held for held, _ in expired]

    def _write_budget(
        self,
        ref: firestore.DocumentReference,
        read: firestore.DocumentSnapshot[firestore.DocumentReference],
        pool: str,
        entries: list[JsonObject],
    ) -> bool:
        """Write the pool's reservations on condition that its document is as `read` (its update
        time, or its absence), so two invocations can never both take the last slot; False when
        another wrote it meanwhile, and the caller reads it again. Unlike a transaction, this holds
        no lock on the document while the invocation decides: the emulator's locks made the
        invocations of a large event queue behind each other."""
        try:
            if not read.exists:
                ref.create({"pool": pool, "reservations": entries})
                return True
            option = self._client.write_option(last_update_time=read.update_time)
            if entries:
                ref.update({"pool": pool, "reservations": entries}, option=option)
            else:
                ref.delete(option=option)
            return True
        except _CHANGED_MEANWHILE:
            return False

    def _join(
        self,
        ref: firestore.DocumentReference,
        read: firestore.DocumentSnapshot[firestore.DocumentReference] | None,
        pool: str,
        entries: list[JsonObject],
        held: JsonObject,
        vms: Sequence[str],
    ) -> bool:
        """Count `vms` with the event's reservation `held`, each in a document of its own (the VMs
        of a large event join at about the same time, and would conflict on the pool's one
        document): `joins/{h(event_key, vm)}` under the pool's document.

        False when the reservation was let go before the joins were written (read again after
        them): they are taken back, and the caller admits the event afresh, as when it came first.
        Also False when the reservation is marked as admitted alone and the pool's document changed
        since `read` (None: it did) before the mark could be taken off: the caller reads it again.
        """
        event_key, token = held["event_key"], held.get("token", "")
        new = [vm for vm in vms if vm not in held["vms"]]
        if not new:
            return True
        if held.get("alone"):
            # Its release must look for joins from now on: the mark goes before any join is written.
            unmarked = [{**entry, "alone": False} if entry is held else entry for entry in entries]
            if read is None or not self._write_budget(ref, read, pool, unmarked):
                return False
        joins = [ref.collection("joins").document(doc_id(event_key, vm)) for vm in new]
        for join, vm in zip(joins, new):
            join.set({"event_key": event_key, "vm": vm, "token": token})
        now = _entry(_entries(ref.get()), event_key)
        if now is not None and now.get("token", "") == token:
            return True
        for join in joins:
            join.delete()
        return False

    def _with_joins(self, ref: firestore.DocumentReference, entries: Sequence[JsonObject]) -> list[list[str]]:
        """The VMs of each reservation, with those that joined it since it was admitted."""
        held = {entry["event_key"]: list(entry["vms"]) for entry in entries}
        tokens = {entry["event_key"]: entry.get("token", "") for entry in entries}
        for snapshot in ref.collection("joins").stream():
            join = snapshot.to_dict() or {}
            # A join of a reservation let go (another token) counts for nothing.
            if join.get("event_key") in held and join.get("token", "") == tokens[join["event_key"]]:
                held[join["event_key"]] = joined(held[join["event_key"]], [join["vm"]])
        return list(held.values())

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        # JSON text, as the SQLite store keeps it: a memento round-trips exactly, whatever it nests
        # (Firestore refuses arrays directly inside arrays).
        fields = {"event_key": event_key, "vm": vm, "memento": json.dumps(memento, sort_keys=True)}
        with self._errors(f"record the drain of {vm}"):
            self._drains.document(doc_id(event_key, vm)).set(fields)

    def record_drain_unless(self, event_key: str, vm: str, memento: JsonObject, ended: str) -> bytes | None:
        # One commit: the record, and a delete of the end's document on condition that it does not
        # exist (a no-op that fails the whole commit when the end is there). The end is checked where
        # the record is written: no later read of it, and no record written once the event ended.
        fields = {"event_key": event_key, "vm": vm, "memento": json.dumps(memento, sort_keys=True)}
        end = self._remembered.document(doc_id(ended))
        with self._errors(f"record the drain of {vm}"):
            while True:
                batch = self._client.batch()
                batch.set(self._drains.document(doc_id(event_key, vm)), fields)
                batch.delete(end, option=self._client.write_option(exists=False))
                try:
                    batch.commit()
                    return None
                except _CHANGED_MEANWHILE:
                    pass
                stored = end.get()  # the end is there: what it says (a rare extra read)
                if stored.exists:
                    return bytes(stored.get("value"))

    def glance(
        self, recall: Sequence[str], event_key: str = "", vms: Sequence[str] = (), pools: Sequence[str] = ()
    ) -> Glance:
        # One BatchGetDocuments for them all: the remembered values, the VMs' drain documents with the
        # event's document of the earlier one-document layout, and the pools' budget documents.
        remembered = {key: self._remembered.document(doc_id(key)) for key in recall}
        drained = {vm: self._drains.document(doc_id(event_key, vm)) for vm in vms}
        earlier = self._drains.document(doc_id(event_key))
        budgets = {pool: self._pools.document(doc_id(pool)) for pool in pools}
        references = [*remembered.values(), *drained.values(), *([earlier] if vms else []), *budgets.values()]
        with self._errors("read what the step needs"):
            found = {snapshot.reference.path: snapshot for snapshot in self._client.get_all(_unique(references))}
        recalled = {
            key: bytes(found[ref.path].get("value")) if found[ref.path].exists else None
            for key, ref in remembered.items()
        }
        records: dict[str, str] = {}
        if vms:
            layout = found[earlier.path]
            if layout.exists:
                records.update(
                    (vm, memento) for vm, memento in (layout.to_dict() or {}).get("vms", {}).items() if vm in drained
                )
            else:
                self._read_without_earlier(event_key)
            for vm, ref in drained.items():
                if found[ref.path].exists:
                    records[vm] = found[ref.path].get("memento")  # a newer record of the VM replaces its entry
        return Glance(
            recalled,
            {vm: json.loads(memento) for vm, memento in records.items()},
            {pool: found[ref.path] for pool, ref in budgets.items()},
        )

    def _read_without_earlier(self, event_key: str) -> None:
        """Remember that the event's drains were read without a document of the earlier layout."""
        self._no_earlier_drains[event_key] = None
        while len(self._no_earlier_drains) > _REMEMBERED_EVENTS:
            del self._no_earlier_drains[next(iter(self._no_earlier_drains))]  # the oldest first

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        # An equality filter only (the automatic single-field index); it also finds the one document
        # in which an earlier version kept all of the event's drains, whose entries a newer
        # record of the same VM replaces.
        query = self._drains.where(filter=firestore.FieldFilter("event_key", "==", event_key))
        with self._errors("read drains of " + event_key):
            documents = [snapshot.to_dict() or {} for snapshot in query.stream()]
        earlier = {vm: memento for document in documents for vm, memento in document.get("vms", {}).items()}
        if all("vm" in document for document in documents):
            self._read_without_earlier(event_key)
        recorded = {document["vm"]: document["memento"] for document in documents if "vm" in document}
        return {vm: json.loads(memento) for vm, memento in {**earlier, **recorded}.items()}

    def all_drains(self) -> Sequence[RecordedDrain]:
        with self._errors("read every drain"):
            documents = [snapshot.to_dict() or {} for snapshot in self._drains.stream()]
        found: dict[tuple[str, str], str] = {}
        # An earlier version's document of all of an event's drains first: a newer record of a VM replaces its entry.
        for document in sorted(documents, key=lambda document: "vm" in document):
            if "vm" in document:
                found[(document["event_key"], document["vm"])] = document["memento"]
            else:
                found.update({(document["event_key"], vm): memento for vm, memento in document.get("vms", {}).items()})
        return [RecordedDrain(key, vm, json.loads(memento)) for (key, vm), memento in sorted(found.items())]

    def forget_drain(self, event_key: str, vm: str) -> None:
        earlier = self._drains.document(doc_id(event_key))
        with self._errors(f"forget the drain of {vm}"):
            self._drains.document(doc_id(event_key, vm)).delete()
            if event_key in self._no_earlier_drains:
                return  # read without one already
            # The transaction only where an earlier version's document still names the VM: a plain
            # read finds out in one round trip, where the transaction takes three.
            snapshot = earlier.get()
            if snapshot.exists and vm in (snapshot.to_dict() or {}).get("vms", {}):
                _forget_earlier_drain(self._client.transaction(), earlier, vm)

    # ---- remembered values and waits

    def remember(self, key: str, value: bytes) -> bytes:
        ref = self._remembered.document(doc_id(key))
        with self._errors("remember " + key):
            try:
                ref.create({"key": key, "value": value})
                return value
            except api_errors.AlreadyExists:
                pass
            stored = ref.get().get("value")
        return bytes(stored)

    def recall(self, key: str) -> bytes | None:
        with self._errors("recall " + key):
            snapshot = self._remembered.document(doc_id(key)).get()
            stored = snapshot.get("value") if snapshot.exists else None
        return None if stored is None else bytes(stored)

    def park(self, pool: str, event_key: str, envelope: bytes, now: datetime) -> None:
        ref = self._parked.document(doc_id(pool, event_key))
        fields = {"pool": pool, "event_key": event_key, "envelope": envelope, "parked_at": now}
        with self._errors(f"park {event_key} in pool {pool}"):
            while True:
                try:
                    ref.create(fields)
                    return
                except api_errors.AlreadyExists:
                    pass
                try:
                    # A later step of a waiting event replaces its envelope but keeps its place in line.
                    ref.update({"envelope": envelope})
                    return
                except api_errors.NotFound:
                    continue  # unparked in between: it waits again, from now

    def parked(self, pool: str) -> Sequence[Parked]:
        # An equality filter only (served by the automatic single-field index); the few waiting
        # events of a pool are put in line here, oldest first, as the SQLite store orders them.
        query = self._parked.where(filter=firestore.FieldFilter("pool", "==", pool))
        with self._errors(f"read the events waiting in pool {pool}"):
            documents = [snapshot.to_dict() or {} for snapshot in query.stream()]
        return in_line(
            Parked(document["event_key"], bytes(document["envelope"]), plain_utc(document["parked_at"]))
            for document in documents
        )

    def unpark(self, pool: str, event_key: str) -> None:
        with self._errors(f"unpark {event_key} from pool {pool}"):
            self._parked.document(doc_id(pool, event_key)).delete()
