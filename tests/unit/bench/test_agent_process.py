"""The command line the benchmarks start the real agent with."""

from __future__ import annotations

from pathlib import Path

from bench.agent_process import AgentOptions, agent_arguments, verify_key
from wire.signing import load_public_key


def _options(transport: str, extra: tuple[str, ...] = ()) -> AgentOptions:
    return AgentOptions(
        cloud="azure", metadata_url="http://127.0.0.1:1", vm_name="vm", transport=transport, extra=extra
    )


def test_an_agent_on_a_bus_with_commands_verifies_them_with_the_runs_key(tmp_path: Path) -> None:
    for transport in ("local", "servicebus", "pubsub"):
        arguments = agent_arguments(_options(transport), tmp_path)

        assert arguments[arguments.index("--verify-key") + 1] == verify_key()
    load_public_key(verify_key())  # a key the agent loads


def test_a_jsonl_agent_has_no_commands_to_verify_and_a_given_key_is_kept(tmp_path: Path) -> None:
    assert "--verify-key" not in agent_arguments(_options("jsonl"), tmp_path)

    arguments = agent_arguments(_options("local", ("--verify-key", "mine")), tmp_path)

    assert arguments.count("--verify-key") == 1
    assert arguments[arguments.index("--verify-key") + 1] == "mine"
