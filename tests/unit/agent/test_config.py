"""The agent's settings that decide what it trusts and what it tells: signed commands, proofs, forwarding."""

from __future__ import annotations

import argparse

import pytest

from agent.config import ConfigError, add_agent_arguments, settings_from_args
from wire.signing import generate_keypair

ENV = (
    "MBRIDGE_VERIFY_KEY",
    "MBRIDGE_INSECURE_UNSIGNED_COMMANDS",
    "MBRIDGE_IDENTITY_PROOF",
    "MBRIDGE_IDENTITY_AUDIENCE",
    "MBRIDGE_FORWARD",
    "MBRIDGE_TRANSPORT",
)
PUBSUB = ["--cloud", "gce", "--transport", "pubsub", "--pubsub-project", "p"]
SERVICEBUS = ["--cloud", "azure", "--transport", "servicebus", "--servicebus-namespace", "ns.servicebus.windows.net"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    return parser.parse_args(argv)


LOCAL = ["--cloud", "azure", "--transport", "local"]


@pytest.mark.parametrize("flags", [PUBSUB, SERVICEBUS, LOCAL], ids=["pubsub", "servicebus", "local"])
def test_a_bus_without_a_verify_key_is_refused_with_what_to_do(flags: list[str]) -> None:
    with pytest.raises(ConfigError) as refused:
        settings_from_args(parse(flags))
    message = str(refused.value)
    assert "--verify-key" in message
    assert "--insecure-unsigned-commands" in message


@pytest.mark.parametrize("flags", [PUBSUB, SERVICEBUS, LOCAL], ids=["pubsub", "servicebus", "local"])
def test_a_bus_takes_a_verify_key_or_the_explicit_insecure_flag(
    flags: list[str], clean_environment: pytest.MonkeyPatch
) -> None:
    public_pem = generate_keypair()[1].decode()
    assert settings_from_args(parse([*flags, "--verify-key", public_pem])).verify_key == public_pem
    assert settings_from_args(parse([*flags, "--insecure-unsigned-commands"])).verify_key is None
    clean_environment.setenv("MBRIDGE_INSECURE_UNSIGNED_COMMANDS", "true")
    assert settings_from_args(parse(flags)).transport == flags[3]


def test_jsonl_needs_no_key() -> None:
    # It takes no commands at all: events go to a file or stdout.
    assert settings_from_args(parse(["--cloud", "azure", "--transport", "jsonl"])).transport == "jsonl"


def test_proofs_are_on_and_only_this_vms_events_are_forwarded_by_default() -> None:
    settings = settings_from_args(parse(["--cloud", "gce"]))
    assert (settings.identity_proof, settings.identity_audience, settings.forward) == (
        "cloud",
        "maintenance-bridge",
        "own",
    )


def test_proof_audience_and_forwarding_come_from_the_environment(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("MBRIDGE_IDENTITY_PROOF", "none")
    clean_environment.setenv("MBRIDGE_IDENTITY_AUDIENCE", "https://bridge.example.com")
    clean_environment.setenv("MBRIDGE_FORWARD", "all")
    settings = settings_from_args(parse(["--cloud", "gce"]))
    assert (settings.identity_proof, settings.identity_audience, settings.forward) == (
        "none",
        "https://bridge.example.com",
        "all",
    )


def test_an_audience_with_spaces_is_refused() -> None:
    with pytest.raises(ConfigError, match="--identity-audience"):
        settings_from_args(parse(["--cloud", "gce", "--identity-audience", "two words"]))
