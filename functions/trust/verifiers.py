"""The `IdentityVerifier`s of the function apps: which VM a message provably comes from.

- `AzureAttestedVerifier`: the attested document (signed by Azure, checked by `azure_attested`)
  names the VM by vmId and subscription; it must have been issued for the key that signed this
  message's digest (its nonce is derived from that key), and the vmId is resolved to the VM's
  name through a `VmDirectory` (the compute API in Azure, a fixed map with the simulator).
- `GceTokenVerifier`: the identity token (signed by Google, checked by `gce_token`) must have been
  issued for this deployment's audience and this message's digest; the instance it names must be
  the one instance of the trusted projects (and zones) with that name (an `InstanceDirectory`:
  the Compute API in Google Cloud, a fixed set with the simulator).
- `CloudVerifier`: the one of the message's cloud (its `source` is /azure/<vm> or /gce/<vm>).

A proof that is missing, invalid, expired, made for another message or another key raises
`UnverifiedError` with what failed; what cannot be checked now (Google's certificates or an
issuing CA unreachable) raises a `RetryableError`, so the message is tried again, not refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from functions.trust.azure_attested import (
    DEFAULT_SIGNER_NAMES,
    AttestationError,
    DocumentExpiredError,
    IssuerFetchError,
    verify_attested_document,
)
from functions.trust.gce_instances import GceInstance, InstanceDirectory, InstanceScope
from functions.trust.gce_token import CertSource, TokenError, TokenExpiredError, verify_with_source
from wire.envelope import Envelope
from wire.errors import RetryableError
from wire.identity import (
    AZURE_ATTESTED,
    AZURE_PROOF_MAX_AGE_SECONDS,
    AZURE_PROOF_REFRESH_SECONDS,
    AZURE_SESSION_KEY,
    AZURE_SIGNATURE,
    GCE_TOKEN,
    Identity,
    IdentityVerifier,
    ProofBinding,
    ProofExpiredError,
    UnverifiedError,
    session_nonce,
    signed_digest,
    token_audience,
)

ATTESTED = "attested"
MAX_DOCUMENT_AGE = timedelta(seconds=AZURE_PROOF_MAX_AGE_SECONDS)


@dataclass(frozen=True)
class VmRecord:
    """One Azure VM of the deployment's scope: its name as Scheduled Events list it in Resources (a
    uniform scale set's instance: `<set>_<instance id>`), its full resource id, its vmId."""

    name: str
    resource_id: str
    vm_id: str
    # The NICs the VM's network profile names, by resource id (standalone VMs and the VMs of flexible
    # scale sets); empty when ARM gave none (a uniform scale set's instance) or the record is static.
    nic_ids: tuple[str, ...] = ()
    # The probe its scale set's automatic instance repairs act on (the Application Health extension's
    # protocol, request path and port; None: a named or default port), or None when the VM's scale set
    # repairs nothing, or it is in none (functions/azure_app/autohealer.py).
    repairs_probe: tuple[str, str, int | None] | None = None


class VmDirectory(Protocol):
    """Azure: the VMs of the deployment's scope (its subscriptions and resource groups)."""

    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        """The VM with that vmId in that subscription, or None when the scope holds none."""
        ...

    def named(self, name: str) -> Sequence[VmRecord]:
        """Every VM of the scope named `name` (compared as ARM does, ignoring case), in every
        subscription: the functions act on VMs by name, so more than one is a name they cannot use."""
        ...


class IssuerUnavailableError(RetryableError):
    """The attested document's issuing CA could not be fetched now; the message is tried again."""


class AzureAttestedVerifier:
    def __init__(
        self,
        *,
        roots: Sequence[x509.Certificate],
        directory: VmDirectory,
        intermediates: Sequence[x509.Certificate] = (),
        signer_names: Sequence[str] = DEFAULT_SIGNER_NAMES,
        subscriptions: Collection[str] | None = None,
        fetch_issuer: Callable[[str], bytes] | None = None,
        nonce_of: Callable[[bytes], str] = session_nonce,
    ) -> None:
        self._roots = list(roots)
        self._directory = directory
        self._intermediates = list(intermediates)
        self._signer_names = tuple(signer_names)
        self._subscriptions = None if subscriptions is None else {s.lower() for s in subscriptions}
        self._fetch_issuer = fetch_issuer
        self._nonce_of = nonce_of  # a test may weaken it to make two keys collide without grinding

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        attested, key_text, signature_text = _azure_proof(envelope)
        key = _session_key(key_text)
        try:
            key.verify(_base64(signature_text, AZURE_SIGNATURE), signed_digest(envelope.digest))
        except InvalidSignature:
            raise UnverifiedError(
                "the agent key's signature does not match this message: it was made for another message, "
                "or the message was changed"
            ) from None
        try:
            document = verify_attested_document(
                attested,
                roots=self._roots,
                intermediates=self._intermediates,
                signer_names=self._signer_names,
                valid_at=accepted_at,
                fetch_issuer=self._fetch_issuer,
            )
        except IssuerFetchError as exc:
            raise IssuerUnavailableError(f"cannot check the attested document now: {exc}") from exc
        except DocumentExpiredError as exc:
            raise ProofExpiredError(f"the attested document is not valid proof: {exc}") from exc
        except AttestationError as exc:
            raise UnverifiedError(f"the attested document is not valid proof: {exc}") from exc
        public = base64.b64decode(key_text)
        if document.nonce != self._nonce_of(public):
            raise UnverifiedError(
                f"the attested document was issued for nonce {document.nonce!r}, not for the key that signed this "
                "message: it was taken from another agent's messages"
            )
        age = accepted_at - document.created_on
        if age > MAX_DOCUMENT_AGE:
            raise ProofExpiredError(
                f"the attested document was made at {document.created_on.isoformat()}, {age} before the bus took "
                f"this message: agents renew theirs every {AZURE_PROOF_REFRESH_SECONDS:g} s and use none older than "
                f"{MAX_DOCUMENT_AGE}, so this one was kept or lifted (a key ground to match it is worth less the "
                "shorter documents live)"
            )
        if self._subscriptions is not None and document.subscription_id.lower() not in self._subscriptions:
            raise UnverifiedError(
                f"the VM is in subscription {document.subscription_id}, which this deployment does not trust "
                "(MBRIDGE_TRUST_SUBSCRIPTIONS)"
            )
        record = self._directory.resource_of(document.subscription_id, document.vm_id)
        if record is None:
            raise UnverifiedError(
                f"no VM with vmId {document.vm_id} in subscription {document.subscription_id} is in this deployment's "
                "scope: it is outside MBRIDGE_TRUST_RESOURCE_GROUPS, or the functions' identity may not read it "
                "(docs/azure.md)"
            )
        _one_of_its_name(record, self._directory.named(record.name))
        # One document is issued for one key: the first key the store sees with it is the only one.
        binding = ProofBinding(f"azure-document|{hashlib.sha256(attested.encode()).hexdigest()}", key_text)
        return Identity(
            vm=record.name,
            how=ATTESTED,
            detail=f"Azure vmId {document.vm_id}",
            resource=record.resource_id,
            binding=binding,
        )


class GceTokenVerifier:
    """A report speaks for the one instance of the deployment's scope that carries its name.

    The token (signed by Google, for this deployment's audience and this message's digest) names
    its VM by project, zone, instance id and name. The project must be trusted (a list is required:
    anyone can create a project with a VM of any name), so must the zone when zones are given, and
    the directory must know exactly one instance of that name in the scope, this very one: a token
    of a VM that only shares the name (in another zone or project, or made again after the
    deployment's was deleted) speaks for nothing.
    """

    def __init__(
        self,
        *,
        certs: CertSource,
        audience: str,
        projects: Collection[str],
        directory: InstanceDirectory,
        zones: Collection[str] | None = None,
    ) -> None:
        self._certs = certs
        self._audience = audience
        self._scope = InstanceScope.of(projects, zones)
        self._directory = directory

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        token = envelope.extensions.get(GCE_TOKEN)
        if not isinstance(token, str) or not token:
            raise UnverifiedError(
                f"no GCE identity token ({GCE_TOKEN}): is the agent's --identity-proof on, and may its VM ask "
                "the metadata server for identity tokens?"
            )
        try:
            vm = verify_with_source(
                token,
                source=self._certs,
                audience=token_audience(self._audience, envelope.digest),
                valid_at=accepted_at,
                now=max(now, accepted_at),
                allowed_projects=self._scope.projects,
            )
        except TokenExpiredError as exc:
            raise ProofExpiredError(f"the identity token is not valid proof for this message: {exc}") from exc
        except TokenError as exc:
            raise UnverifiedError(f"the identity token is not valid proof for this message: {exc}") from exc
        sender = GceInstance(vm.project_id, vm.zone, vm.instance_name, vm.instance_id)
        if not self._scope.admits(sender.project, sender.zone):
            raise UnverifiedError(
                f"the token is of {sender}, in a zone this deployment does not trust ({self._scope}): add the zone "
                "to the trusted zones (MBRIDGE_TRUST_ZONES) if its VMs are to report"
            )
        known = self._the_one_named(sender)
        if known != sender:
            raise UnverifiedError(
                f"the token is of {sender}, but the instance named {sender.name} in {self._scope} is {known}: the "
                f"sender is another VM with the same name (in another zone or project), or {sender.name} was "
                "deleted and made again since the instances were listed"
            )
        return Identity(
            vm=sender.name, how=ATTESTED, detail=f"GCE instance id {sender.instance_id}", resource=sender.resource
        )

    def _the_one_named(self, sender: GceInstance) -> GceInstance:
        named = [
            instance
            for instance in self._directory.instances_named(sender.name, expecting=sender.instance_id)
            if self._scope.admits(instance.project, instance.zone)
        ]
        if not named:
            raise UnverifiedError(
                f"the token is of {sender}, but no instance named {sender.name} in {self._scope} is known to the "
                "functions: it was deleted, or the instances cannot be listed there (docs/gcp.md, Trust)"
            )
        if len(named) > 1:
            raise UnverifiedError(
                f"{len(named)} instances of {self._scope} are named {sender.name} "
                f"({'; '.join(map(str, named))}), so the name stands for none of them: rename all but one, or "
                "narrow the trusted projects and zones (MBRIDGE_TRUST_PROJECTS, MBRIDGE_TRUST_ZONES)"
            )
        return named[0]


class CloudVerifier:
    """The verifier of the message's cloud; a cloud without one has no valid proof."""

    def __init__(self, *, azure: IdentityVerifier | None = None, gce: IdentityVerifier | None = None) -> None:
        self._verifiers = {"azure": azure, "gce": gce}

    def verify(self, envelope: Envelope, accepted_at: datetime, now: datetime) -> Identity:
        cloud = envelope.source.split("/")[1] if envelope.source.count("/") >= 2 else ""
        verifier = self._verifiers.get(cloud)
        if verifier is None:
            configured = ", ".join(name for name, v in self._verifiers.items() if v is not None) or "none"
            raise UnverifiedError(f"this deployment verifies proofs of {configured}; the message is of {cloud!r}")
        return verifier.verify(envelope, accepted_at, now)


_AZURE = (AZURE_ATTESTED, AZURE_SESSION_KEY, AZURE_SIGNATURE)


def _one_of_its_name(record: VmRecord, named: Sequence[VmRecord]) -> None:
    """A VM whose name another VM of the scope also has cannot be told apart where the functions act
    (Resources, pools and commands name VMs): its report is refused rather than moving the other."""
    others = [other for other in named if other.vm_id.lower() != record.vm_id.lower()]
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise UnverifiedError(
            f"{record.resource_id} is named {record.name!r} like {others[0].resource_id}{more} in this "
            "deployment's scope: the functions act on VMs by the name Scheduled Events give them, so one name must "
            "be one VM; narrow MBRIDGE_TRUST_RESOURCE_GROUPS or MBRIDGE_TRUST_SUBSCRIPTIONS, or rename one"
        )


def _azure_proof(envelope: Envelope) -> tuple[str, str, str]:
    values = [envelope.extensions.get(name) for name in _AZURE]
    texts = [value for value in values if isinstance(value, str) and value]
    if len(texts) != len(_AZURE):
        raise UnverifiedError(
            f"no Azure proof of identity (extension attributes {', '.join(_AZURE)}): is the agent's "
            "--identity-proof on, and does it reach IMDS's attested document?"
        )
    return texts[0], texts[1], texts[2]


def _base64(text: str, name: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise UnverifiedError(f"{name} is not base64") from None


def _session_key(text: str) -> Ed25519PublicKey:
    raw = _base64(text, AZURE_SESSION_KEY)
    if len(raw) != 32:
        raise UnverifiedError(f"{AZURE_SESSION_KEY} is not an Ed25519 public key (32 bytes), got {len(raw)} bytes")
    return Ed25519PublicKey.from_public_bytes(raw)
