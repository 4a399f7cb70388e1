"""A trust file: everything a local function host needs to verify proofs, in one JSON document.

The simulator writes one for each run (`mbridge simulate --trust-file PATH`, `Simulator.trust()`),
since it signs proofs with keys it makes for that run; the demo and the end-to-end tests verify
with it exactly as the cloud apps verify with Azure's and Google's keys. Format (either cloud may
be left out; a message of a cloud that is left out has no valid proof):

    {"format": "maintenance-bridge trust 1",
     "azure": {"roots": PEM, "intermediates": PEM, "signer_names": [...],
               "subscriptions": [...], "vms": {vmId: VM name, or {"name": ..., "resource_id": ...}}},
     "gce": {"certs": {key id: PEM certificate}, "audience": "...", "projects": [...], "zones": [...],
             "instances": {"projects/P/zones/Z/instances/NAME": instance id}}}

`gce.projects` is required (a token of any project would do otherwise), `gce.zones` optional (every
zone of the projects); `gce.instances` is the instance directory: a report is verified only for
the one instance listed under its name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from functions.trust.azure_attested import DEFAULT_SIGNER_NAMES, load_certificates
from functions.trust.gce_instances import StaticInstanceDirectory
from functions.trust.gce_token import StaticCerts
from functions.trust.verifiers import AzureAttestedVerifier, CloudVerifier, GceTokenVerifier, VmRecord
from wire.identity import TRUST_FILE_FORMAT as FORMAT
from wire.identity import session_nonce


class TrustFileError(ValueError):
    """The trust file cannot be used; the message says which part and what it should be."""


class MappedVms:
    """The VMs of a fixed map, in any subscription the verifier trusts: vmId → the VM's name, or
    `{"name": ..., "resource_id": ...}` (a name alone gets a resource id in resource group `vms`)."""

    def __init__(self, vms: Mapping[str, str | Mapping[str, str]]) -> None:
        self._vms = {vm_id.lower(): _record(vm_id.lower(), entry) for vm_id, entry in vms.items()}

    def resource_of(self, subscription_id: str, vm_id: str) -> VmRecord | None:
        record = self._vms.get(vm_id.lower())
        if record is None or record.resource_id:
            return record
        return VmRecord(record.name, _standalone(subscription_id, record.name), record.vm_id)

    def named(self, name: str) -> list[VmRecord]:
        return [record for record in self._vms.values() if record.name.lower() == name.lower()]


def _record(vm_id: str, entry: str | Mapping[str, str]) -> VmRecord:
    if isinstance(entry, str):
        return VmRecord(entry, "", vm_id)
    return VmRecord(entry["name"], entry["resource_id"], vm_id)


def _standalone(subscription_id: str, name: str) -> str:
    group = f"/subscriptions/{subscription_id.lower()}/resourceGroups/vms"
    return f"{group}/providers/Microsoft.Compute/virtualMachines/{name}"


def verifier_from_trust(
    document: Mapping[str, Any],
    *,
    nonce_of: Callable[[bytes], str] = session_nonce,
    fetch_issuer: Callable[[str], bytes] | None = None,
) -> CloudVerifier:
    """The verifier a trust file describes. `nonce_of` (the Azure key → nonce rule) is for drills that
    simulate a ground key without grinding one. `fetch_issuer` (url → the certificate there) lets the
    Azure verifier fetch a signer's issuing CA from its caIssuers URL (off by default: a trust file
    names the intermediates it needs)."""
    if document.get("format") != FORMAT:
        raise TrustFileError(f"not a trust file: its format must be {FORMAT!r}, got {document.get('format')!r}")
    azure, gce = document.get("azure"), document.get("gce")
    return CloudVerifier(
        azure=None if azure is None else _azure(_section(azure, "azure"), nonce_of, fetch_issuer),
        gce=None if gce is None else _gce(_section(gce, "gce")),
    )


def load_trust_file(path: str | Path) -> CloudVerifier:
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrustFileError(f"cannot read the trust file {path}: {exc}") from exc
    if not isinstance(document, dict):
        raise TrustFileError(f"the trust file {path} is not a JSON object")
    return verifier_from_trust(document)


def _azure(
    section: Mapping[str, Any], nonce_of: Callable[[bytes], str], fetch_issuer: Callable[[str], bytes] | None
) -> AzureAttestedVerifier:
    vms = section.get("vms")
    if not isinstance(vms, dict) or not all(isinstance(k, str) and _vm_entry(v) for k, v in vms.items()):
        raise TrustFileError('azure.vms must map each vmId to its VM name, or to {"name": ..., "resource_id": ...}')
    return AzureAttestedVerifier(
        roots=load_certificates(_text(section, "roots").encode()),
        intermediates=load_certificates(section["intermediates"].encode()) if section.get("intermediates") else [],
        signer_names=_names(section.get("signer_names", list(DEFAULT_SIGNER_NAMES)), "azure.signer_names"),
        subscriptions=_names(section["subscriptions"], "azure.subscriptions") if "subscriptions" in section else None,
        directory=MappedVms(vms),
        nonce_of=nonce_of,
        fetch_issuer=fetch_issuer,
    )


def _gce(section: Mapping[str, Any]) -> GceTokenVerifier:
    certs = section.get("certs")
    if not isinstance(certs, dict) or not certs or not all(isinstance(v, str) for v in certs.values()):
        raise TrustFileError("gce.certs must map key ids to PEM certificates")
    if not section.get("projects"):
        raise TrustFileError(
            "gce.projects is missing: add the list of project ids whose VMs may report (a token of any project "
            'would be accepted otherwise), e.g. "projects": ["my-project"]'
        )
    zones = section.get("zones")
    return GceTokenVerifier(
        certs=StaticCerts(certs),
        audience=_text(section, "audience"),
        projects=_names(section["projects"], "gce.projects"),
        zones=None if zones is None else _names(zones, "gce.zones"),
        directory=_instances(section.get("instances")),
    )


def _vm_entry(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, dict) and all(
        isinstance(value.get(key), str) and value[key] for key in ("name", "resource_id")
    )


def _instances(value: object) -> StaticInstanceDirectory:
    wanted = 'gce.instances must map each instance\'s "projects/P/zones/Z/instances/NAME" to its numeric id'
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TrustFileError(wanted)
    try:
        return StaticInstanceDirectory.from_resources(value)
    except ValueError as exc:
        raise TrustFileError(f"{wanted}: {exc}") from exc


def _section(value: object, name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TrustFileError(f"{name} must be a JSON object")
    return value


def _text(section: Mapping[str, Any], key: str) -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value:
        raise TrustFileError(f"{key} must be a non-empty string")
    return value


def _names(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise TrustFileError(f"{name} must be a list of non-empty strings")
    return value
