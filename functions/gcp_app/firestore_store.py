"""The Firestore implementation of the StateStore port (docs/architecture.md#the-functions), on
google-cloud-firestore. They behave as the SQLite store of functions/local_app/store.py does.

Collections (each name starts with a prefix, `mbridge_` by default, so that two deployments
can share one database):

    claims/{h(key)}            key, state (in-progress | done), lease_until, updated_at, expire_at
    budget_pools/{h(pool)}     pool, reservations: [{event_key, vms}]   one document per pool
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
read and forgotten from. A pool's reservations stay in one document, for the transaction that
admits an event; when one more event would not fit, it waits for a slot as for a budget (an event
alone always fits). An envelope waiting for the budget is at most 256 KiB (`MAX_ENVELOPE_BYTES`),
a remembered value a command or an event's end, and audit records cut their texts.

Every method is atomic on its own: single-document writes (`create`, `update`, `delete`) are
atomic in Firestore, and every read-modify-write is a read followed by a write conditional on the
document being as it was read (`create` when it was absent, else its update time as a
precondition), applied again to what is there when another invocation wrote it meanwhile. The
whole budget of a pool is one document, so two events racing for its last slot are serialised by
that document and never both admitted. Round trips: a claim is one `create` (a duplicate: two);
completing it one `update`; a budget change a read and a write (no write when nothing changes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta, timezone

from google.api_core import exceptions as api_errors
from google.auth import exceptions as auth_errors
from google.cloud import firestore

from functions.core import store_rules
from functions.core.ports import Claim, JsonObject, Parked
from functions.core.store_rules import DONE, IN_PROGRESS, admits, claim_found, in_line, joined
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


# ---------------------------------------------------------------- budget rules


def _admitted(
    reservations: list[JsonObject], pool: str, event_key: str, vms: Sequence[str], limit: int | None
) -> tuple[bool, list[JsonObject] | None]:
    """Whether the pool admits the event, and its reservations to write (None: nothing to write)."""
    for index, entry in enumerate(reservations):
        if entry["event_key"] == event_key:
            # Admitted already: another VM of the event joins it (each VM's own report drains it).
            grown = joined(entry["vms"], vms)
            if grown == entry["vms"]:
                return True, None
            return True, [*reservations[:index], {**entry, "vms": grown}, *reservations[index + 1 :]]
    if not admits((entry["vms"] for entry in reservations), vms, limit):
        return False, None
    admitted = [*reservations, {"event_key": event_key, "vms": list(vms)}]
    if reservations and len(json.dumps(admitted).encode()) > RESERVATIONS_BYTES:
        # The pool's document is full: the event waits for a slot as for a budget.
        LOGGER.warning("the reservations of pool %s fill their document: %s waits for a slot", pool, event_key)
        return False, None
    return True, admitted


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

    def complete(self, key: str, now: datetime) -> None:
        fields = {"state": DONE, "updated_at": now, "expire_at": now + CLAIM_RETENTION}
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

    def reserve(self, pool: str, event_key: str, vms: Sequence[str], limit: int | None) -> bool:
        def admit(reservations: list[JsonObject]) -> tuple[bool, list[JsonObject] | None]:
            return _admitted(reservations, pool, event_key, vms, limit)

        return self._update_budget(pool, admit, f"reserve budget in pool {pool}")

    def release(self, pool: str, event_key: str) -> None:
        def drop(reservations: list[JsonObject]) -> tuple[bool, list[JsonObject] | None]:
            kept = [entry for entry in reservations if entry["event_key"] != event_key]
            return True, (None if len(kept) == len(reservations) else kept)

        self._update_budget(pool, drop, f"release budget in pool {pool}")

    def _update_budget(
        self,
        pool: str,
        change: Callable[[list[JsonObject]], tuple[bool, list[JsonObject] | None]],
        action: str,
    ) -> bool:
        """Read the pool's document, apply `change`, write what it returns (None: nothing).

        The write is conditional on the document being as it was read (its update time, or its
        absence), so two invocations can never both take the last slot: the loser's write fails
        and the change is applied again to what the winner left. Unlike a transaction, this holds
        no lock on the document while the invocation decides: one pool's document is what every
        VM of a large event writes, and the emulator's locks made them queue behind each other.
        """
        ref = self._pools.document(doc_id(pool))
        with self._errors(action):
            for attempt in range(store_rules.BUDGET_ATTEMPTS):
                snapshot = ref.get()
                document = (snapshot.to_dict() or {}) if snapshot.exists else {}
                answer, reservations = change(list(document.get("reservations", [])))
                if reservations is None:
                    return answer
                try:
                    if not snapshot.exists:
                        ref.create({"pool": pool, "reservations": reservations})
                        return answer
                    option = self._client.write_option(last_update_time=snapshot.update_time)
                    if reservations:
                        ref.update({"pool": pool, "reservations": reservations}, option=option)
                    else:
                        ref.delete(option=option)
                    return answer
                except _CHANGED_MEANWHILE:
                    # Someone wrote the pool between our read and write: read it again shortly.
                    time.sleep(store_rules.budget_backoff(attempt))
        raise FirestoreUnavailableError(
            f"the budget of pool {pool!r} changed under {store_rules.BUDGET_ATTEMPTS} attempts to {action}; retry later"
        )

    # ---- drains

    def record_drain(self, event_key: str, vm: str, memento: JsonObject) -> None:
        # JSON text, as the SQLite store keeps it: a memento round-trips exactly, whatever it nests
        # (Firestore refuses arrays directly inside arrays).
        fields = {"event_key": event_key, "vm": vm, "memento": json.dumps(memento, sort_keys=True)}
        with self._errors(f"record the drain of {vm}"):
            self._drains.document(doc_id(event_key, vm)).set(fields)

    def drains(self, event_key: str) -> Mapping[str, JsonObject]:
        # An equality filter only (the automatic single-field index); it also finds the one document
        # in which an earlier version kept all of the event's drains, whose entries a newer
        # record of the same VM replaces.
        query = self._drains.where(filter=firestore.FieldFilter("event_key", "==", event_key))
        with self._errors("read drains of " + event_key):
            documents = [snapshot.to_dict() or {} for snapshot in query.stream()]
        earlier = {vm: memento for document in documents for vm, memento in document.get("vms", {}).items()}
        recorded = {document["vm"]: document["memento"] for document in documents if "vm" in document}
        return {vm: json.loads(memento) for vm, memento in {**earlier, **recorded}.items()}

    def forget_drain(self, event_key: str, vm: str) -> None:
        earlier = self._drains.document(doc_id(event_key))
        with self._errors(f"forget the drain of {vm}"):
            self._drains.document(doc_id(event_key, vm)).delete()
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
