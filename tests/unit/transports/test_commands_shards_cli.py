"""The commands shard on the command line: `mbridge approve --commands-shards N` sends to the target
VM's entity, and `mbridge commands-entity` prints that entity for whoever deploys without Terraform."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest

from mbridge import approve_cli
from mbridge.cli import build_parser, main
from wire.shards import entity_for
from wire.transports.pubsub import PubSubSettings
from wire.transports.servicebus import ServiceBusSettings

NAMESPACE = "mbridge-test.servicebus.windows.net"
SERVICEBUS = ["--transport", "servicebus", "--servicebus-namespace", NAMESPACE]
PUBSUB = ["--cloud", "gce", "--transport", "pubsub", "--pubsub-project", "prod"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No MBRIDGE_* variable but those the test sets."""
    for name in list(os.environ):
        if name.startswith("MBRIDGE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def approve_settings(*flags: str, target: str = "web-7") -> ServiceBusSettings | PubSubSettings:
    args = build_parser("approve").parse_args(["approve", "--event-id", "E1", "--target", target, *flags])
    return approve_cli.bus_settings(approve_cli.resolve(args))


def test_approve_sends_to_one_entity_by_default() -> None:
    assert approve_settings(*SERVICEBUS).commands_shards == 1


@pytest.mark.parametrize("bus", [SERVICEBUS, PUBSUB])
def test_approve_takes_the_shard_count_from_the_flag_or_the_environment(
    bus: list[str], clean_environment: pytest.MonkeyPatch
) -> None:
    assert approve_settings(*bus, "--commands-shards", "16").commands_shards == 16
    clean_environment.setenv("MBRIDGE_COMMANDS_SHARDS", "8")
    assert approve_settings(*bus).commands_shards == 8


@pytest.mark.parametrize("value", ["0", "1025", "many"])
def test_approve_refuses_a_shard_count_out_of_range_before_sending(value: str) -> None:
    # WHEN approve is run with an unusable count THEN it says which flag, and exits 2 having sent nothing
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["approve", "--event-id", "E1", "--target", "web-7", *SERVICEBUS, "--commands-shards", value])
    assert code == 2
    assert "--commands-shards" in err.getvalue()
    assert "use a whole number >= 1 and <= 1024" in err.getvalue()


def run_entity(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["commands-entity", *argv])
        except SystemExit as exit_:  # argparse's own refusals
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_commands_entity_prints_the_entity_of_a_vm() -> None:
    code, out, _ = run_entity("--vm", "vm-0", "--shards", "8")
    assert (code, out) == (0, "maintenance-commands-7\n")
    assert out.strip() == entity_for("maintenance-commands", "vm-0", 8)


def test_commands_entity_takes_a_base_and_several_vms() -> None:
    code, out, _ = run_entity("--vm", "vm-6", "--vm", "vm-7", "--shards", "8", "--base", "cmds")
    assert code == 0
    assert out.splitlines() == ["vm-6 cmds-1", "vm-7 cmds"]


def test_commands_entity_reads_the_count_from_the_environment(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("MBRIDGE_COMMANDS_SHARDS", "8")
    assert run_entity("--vm", "vm-0")[:2] == (0, "maintenance-commands-7\n")


@pytest.mark.parametrize("argv", [["--vm", "vm-0"], ["--vm", "vm-0", "--shards", "0"], ["--shards", "4"]])
def test_commands_entity_refuses_without_a_usable_count_or_a_vm(argv: list[str]) -> None:
    code, out, err = run_entity(*argv)
    assert code == 2
    assert out == ""
    assert "--shards" in err or "--vm" in err
