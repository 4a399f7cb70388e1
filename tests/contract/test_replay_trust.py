"""`mbridge replay` checks the proofs the simulator's metadata services really issue, with the trust
the functions use (a trust file, or a function app's settings), as of when the functions received
each message: the same report is genuine received on time, and expired received two hours later."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from functions.local_app.recording import format_received
from mbridge.cli import main
from simulator.server import Simulator
from tests.contract.test_recover_local import VM, event_of
from tests.identity import proven_by_metadata
from wire.envelope import encode, envelope_for_event
from wire.model import Cloud, EventStatus


@pytest.fixture(params=[Cloud.AZURE, Cloud.GCE], ids=["azure", "gce"])
def simulator(request: pytest.FixtureRequest) -> Iterator[Simulator]:
    with Simulator(cloud=request.param.value, vm_names=[VM]) as running:
        yield running


def proven_report(simulator: Simulator, at: datetime) -> bytes:
    """web-0's report of a Reboot, proven by its metadata service now."""
    cloud = Cloud(simulator.cloud)
    body = encode(envelope_for_event(event_of(cloud, EventStatus.SCHEDULED), at))
    return proven_by_metadata(cloud, simulator.base_urls[0], body)


def replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: bytes, received_at: datetime, *trust: str
) -> tuple[list[tuple[str, str]], str]:
    """(kind, action) of each line `mbridge replay` prints for the message received at `received_at`."""
    recorded = tmp_path / "recorded.jsonl"
    recorded.write_text(
        json.dumps({"received_at": format_received(received_at), "envelope": json.loads(body)}) + "\n",
        encoding="utf-8",
    )
    assert main(["replay", "--events", str(recorded), *trust]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    return [(line["kind"], line["action"]) for line in lines], err + "".join(line["reason"] for line in lines)


def test_a_recorded_proof_holds_as_of_when_it_was_received_and_not_two_hours_later(
    simulator: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN web-0's report, proven by its metadata service now, and the trust file the functions verify with
    now = datetime.now(timezone.utc)
    body = proven_report(simulator, now)
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps(simulator.trust()), encoding="utf-8")

    # WHEN it is replayed as received at once THEN its proof holds and web-0 is drained
    on_time, said = replayed(tmp_path, capsys, body, now, "--trust-file", str(trust))
    assert on_time[0] == ("action", "drain")
    assert f"trust: proofs checked with the trust file {trust}" in said

    # WHEN the same message is replayed as received two hours later THEN its proof has expired
    late, why = replayed(tmp_path, capsys, body, now + timedelta(hours=2), "--trust-file", str(trust))
    assert late == [("unverified", "none")]
    assert "expired" in why


def test_the_gcp_apps_trust_settings_verify_as_the_app_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the GCP app's settings, whose trust is a trust file (MBRIDGE_TRUST_FILE, as in local runs)
    with Simulator(cloud="gce", vm_names=[VM]) as simulator:
        now = datetime.now(timezone.utc)
        body = proven_report(simulator, now)
        trust = tmp_path / "trust.json"
        trust.write_text(json.dumps(simulator.trust()), encoding="utf-8")
    monkeypatch.setenv("MBRIDGE_GCP_PROJECT", "maintenance-bridge-sim")
    monkeypatch.setenv("MBRIDGE_TRUST_FILE", str(trust))

    # WHEN replayed with those settings THEN the proof is checked, and replay says with what
    actions, said = replayed(tmp_path, capsys, body, now, "--trust-settings", "gcp")
    assert actions[0] == ("action", "drain")
    assert "the GCP function app's trust settings (MBRIDGE_TRUST_*), with the trust file" in said

    # AND the same report changed after it was proven (its NotBefore moved) is refused
    forged = json.loads(body)
    forged["data"]["not_before"] = "2030-01-01T00:00:00Z"
    refused, _ = replayed(tmp_path, capsys, json.dumps(forged).encode(), now, "--trust-settings", "gcp")
    assert refused == [("unverified", "none")]


def test_the_azure_apps_trust_settings_missing_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MBRIDGE_TRUST_SUBSCRIPTIONS", "MBRIDGE_LB_SUBSCRIPTION_ID", "MBRIDGE_TRUST_ROOTS"):
        monkeypatch.delenv(name, raising=False)
    events = tmp_path / "events.jsonl"
    events.write_text("", encoding="utf-8")
    assert main(["replay", "--events", str(events), "--trust-settings", "azure"]) == 2
    assert "mbridge replay: --trust-settings azure: MBRIDGE_TRUST_" in capsys.readouterr().err
