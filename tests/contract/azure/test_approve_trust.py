"""`mbridge approve` checks an answer's Azure proof as the functions check a report's: the same roots,
intermediates, signer names, issuer fetching and directory of the deployment's scope (subscriptions
x resource groups), read from the same settings (docs/commands.md#mbridge-approve).

The simulator's IMDS signs attested documents with a PKI it makes for the run, so the answers here
are genuine as far as a verifier can tell; only the roots and intermediates are the simulator's.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from agent.config import ConfigError
from agent.proofs import AzureAttestedProver
from agent.sources.azure.client import AzureImdsClient
from functions.azure_app import settings as names
from functions.azure_app import vm_directory
from functions.azure_app.vm_directory import StaticVmDirectory
from mbridge import approve_cli
from simulator.azure_api import SIM_SUBSCRIPTION_ID, vm_id
from simulator.server import Simulator
from wire.envelope import decode, encode, envelope_for_command_result
from wire.identity import IdentityVerifier
from wire.model import Cloud, CommandResult

VMS = ("web-0", "web-1")
TRUST_VARIABLES = (
    names.TRUST_ROOTS,
    names.TRUST_INTERMEDIATES,
    names.TRUST_SIGNER_NAMES,
    names.TRUST_SUBSCRIPTIONS,
    names.TRUST_RESOURCE_GROUPS,
    names.TRUST_FILE,
    names.LB_SUBSCRIPTION_ID,
    names.LB_RESOURCE_GROUP,
    names.LB_NAME,
    names.LB_NIC_RESOURCE_GROUP,
)


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with Simulator(cloud="azure", vm_names=VMS) as started:
        yield started


@pytest.fixture
def deployment(simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The app's trust settings in the operator's environment, trusting the simulator's PKI, and a
    directory of the simulator's VMs where the compute API would be asked (with the operator's
    credentials)."""
    for variable in TRUST_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    section = simulator.trust()["azure"]
    assert isinstance(section, dict)
    settings = {
        names.TRUST_ROOTS: section["roots"],
        names.TRUST_INTERMEDIATES: section["intermediates"],
        names.TRUST_SUBSCRIPTIONS: SIM_SUBSCRIPTION_ID,
        names.TRUST_RESOURCE_GROUPS: "vms",
    }
    for variable, value in settings.items():
        monkeypatch.setenv(variable, value)
    directories: list[dict[str, Any]] = []

    def scoped(credential: Any = None, **scope: Any) -> StaticVmDirectory:
        directories.append(scope)
        return StaticVmDirectory({SIM_SUBSCRIPTION_ID: {vm_id(vm): vm for vm in VMS}})

    monkeypatch.setattr(vm_directory, "ComputeVmDirectory", scoped)
    return {**settings, "directories": directories}


def approve_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    approve_cli.configure(parser)
    return parser.parse_args(["--event-id", "E-1", "--target", "web-0", "--transport", "local", *extra])


def answer(simulator: Simulator, vm: str = "web-0") -> bytes:
    """An agent's answer to an approve command, with the proof it attaches."""
    result = CommandResult(command_id="c" * 32, accepted=True, event_id="E-1", target=vm, reason="approved")
    body = encode(envelope_for_command_result(result, Cloud.AZURE, datetime.now(timezone.utc)))
    client = AzureImdsClient.for_base_url(simulator.base_urls[VMS.index(vm)])
    try:
        return AzureAttestedProver(client, lambda: 0.0).prove(body)
    finally:
        client.close()


def sender_of(verifier: IdentityVerifier | None, body: bytes) -> str:
    assert verifier is not None
    now = datetime.now(timezone.utc)
    return verifier.verify(decode(body), now, now).vm


def test_a_genuine_answer_verifies_with_the_deployments_trust_settings(
    simulator: Simulator, deployment: dict[str, Any]
) -> None:
    # GIVEN the deployment's trust settings in the operator's environment
    # WHEN mbridge approve builds its verifier and checks a genuine answer of web-0
    verifier = approve_cli.build_verifier(approve_cli.resolve(approve_args()))

    # THEN the answer is web-0's, looked up in the deployment's scope
    assert sender_of(verifier, answer(simulator)) == "web-0"
    assert deployment["directories"] == [{"resource_groups": ("vms",), "subscriptions": (SIM_SUBSCRIPTION_ID,)}]


def test_the_flags_name_the_same_settings_as_the_variables(
    simulator: Simulator, deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the subscriptions and resource groups given as flags rather than variables
    monkeypatch.delenv(names.TRUST_SUBSCRIPTIONS)
    monkeypatch.delenv(names.TRUST_RESOURCE_GROUPS)
    args = approve_args("--trust-subscriptions", SIM_SUBSCRIPTION_ID, "--trust-resource-groups", "vms")

    # WHEN mbridge approve builds its verifier from them
    verifier = approve_cli.build_verifier(approve_cli.resolve(args))

    # THEN it verifies as with the variables
    assert sender_of(verifier, answer(simulator, "web-1")) == "web-1"


def test_without_resource_groups_the_azure_verifier_is_refused_naming_the_setting(
    deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN trusted subscriptions but no resource groups (and no load balancer to take them from)
    monkeypatch.delenv(names.TRUST_RESOURCE_GROUPS)

    # WHEN mbridge approve builds its verifier
    # THEN it refuses, naming the setting and its flag: a VM of any resource group could answer
    with pytest.raises(ConfigError, match=names.TRUST_RESOURCE_GROUPS) as refused:
        approve_cli.build_verifier(approve_cli.resolve(approve_args()))
    assert "--trust-resource-groups" in str(refused.value)
