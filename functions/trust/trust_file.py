"""A trust file: everything a local function host needs to verify proofs, in one JSON document.

The simulator writes one for each run (`mbridge simulate --trust-file PATH`, `Simulator.trust()`),
since it signs proofs with keys it makes for that run; the demo and the end-to-end tests verify
with it exactly as the cloud apps verify with Azure's and Google's keys. Format (either cloud may
be left out; a message of a cloud that is left out has no valid proof):

    {"format": "maintenance-bridge trust 1",
     "azure": {"roots": PEM, "intermediates": PEM, "signer_names": [...],
               "subscriptions": [...], "vms": {vmId: VM name}},
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
from typing import Any

from functions.trust.azure_attested import DEFAULT_SIGNER_NAMES, load_certificates
from functions.trust.gce_instances import StaticInstanceDirectory
from functions.trust.gce_token import StaticCerts
from functions.trust.verifiers import AzureAttestedVerifier, CloudVerifier, GceTokenVerifier
from wire.identity import TRUST_FILE_FORMAT as FORMAT


class TrustFileError(ValueError):
    """The trust file cannot be used; the message says which part and what it should be."""


class MappedVms:
    """vmId → VM name from a fixed map (any subscription the verifier trusts)."""

    def __init__(self, vms: Mapping[str, str]) -> None:
        self._vms = {vm_id.lower(): name for vm_id, name in vms.items()}

    def name_of(self, subscription_id: str, vm_id: str) -> str | None:
        return self._vms.get(vm_id.lower())


def verifier_from_trust(document: Mapping[str, Any]) -> CloudVerifier:
    if document.get("format") != FORMAT:
        raise TrustFileError(f"not a trust file: its format must be {FORMAT!r}, got {document.get('format')!r}")
    azure, gce = document.get("azure"), document.get("gce")
    return CloudVerifier(
        azure=None if azure is None else _azure(_section(azure, "azure")),
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


def _azure(section: Mapping[str, Any]) -> AzureAttestedVerifier:
    vms = section.get("vms")
    if not isinstance(vms, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in vms.items()):
        raise TrustFileError("azure.vms must map each vmId to its VM name")
    return AzureAttestedVerifier(
        roots=load_certificates(_text(section, "roots").encode()),
        intermediates=load_certificates(section["intermediates"].encode()) if section.get("intermediates") else [],
        signer_names=_names(section.get("signer_names", list(DEFAULT_SIGNER_NAMES)), "azure.signer_names"),
        subscriptions=_names(section["subscriptions"], "azure.subscriptions") if "subscriptions" in section else None,
        directory=MappedVms(vms),
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
