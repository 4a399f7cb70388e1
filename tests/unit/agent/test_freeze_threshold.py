"""The threshold under which a Freeze leaves /readyz ready is the policy's, from one place."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

import pytest

from agent.config import ConfigError, add_agent_arguments, settings_from_args
from agent.sources.azure.client import AzureObservation
from agent.sources.azure.document import parse_scheduled_events
from agent.sources.azure.tracker import AzureTracker
from functions.core.policy import DEFAULT_POLICY


def freeze_of(seconds: int) -> AzureObservation:
    entry = {
        "EventId": "F-1",
        "EventType": "Freeze",
        "EventStatus": "Scheduled",
        "Resources": ["web-0"],
        "NotBefore": "Mon, 02 Mar 2026 12:00:00 GMT",
        "DurationInSeconds": seconds,
    }
    document = parse_scheduled_events(json.dumps({"DocumentIncarnation": 1, "Events": [entry]}))
    return AzureObservation(document=document, observed_at=datetime(2026, 3, 1, tzinfo=timezone.utc), lag_bound=0.0)


def pending(tracker: AzureTracker, seconds: int) -> str | None:
    tracker.commit(tracker.apply(freeze_of(seconds)))
    return tracker.impact_pending()


def test_by_default_the_agent_takes_as_harmless_what_the_default_policy_approves_without_a_drain() -> None:
    limit = DEFAULT_POLICY.harmless_freeze_seconds
    assert pending(AzureTracker("web-0", None), limit) is None
    assert pending(AzureTracker("web-0", None), limit + 1) == "freeze F-1 scheduled for this VM"


def test_a_policy_with_another_threshold_is_followed_through_the_agents_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MBRIDGE_HARMLESS_FREEZE_SECONDS", "30")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--cloud", "azure"]))
    assert settings.harmless_freeze_seconds == 30
    assert pending(AzureTracker("web-0", None, settings.harmless_freeze_seconds), 30) is None
    with pytest.raises(ConfigError, match="--harmless-freeze-seconds"):
        settings_from_args(parser.parse_args(["--cloud", "azure", "--harmless-freeze-seconds", "-1"]))
