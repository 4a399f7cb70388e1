"""The keys the function core's state is kept under (functions/core/keys.py)."""

from __future__ import annotations

import pytest

from functions.core.keys import ended_key, ended_subject, own_part
from tests.factories import azure_event
from wire.model import Cloud, EventKind


@pytest.mark.parametrize("event_id", ["E-1", "maintenance|with|bars", "gce-maintenance-1"])
def test_an_end_key_gives_back_its_event_and_vm_whatever_the_event_id_holds(event_id: str) -> None:
    # GIVEN web-0's part of an event whose id may hold the separator
    event = own_part(azure_event(cloud=Cloud.GCE, event_id=event_id, kind=EventKind.LIVE_MIGRATE), "web-0")

    # WHEN its end key is read back
    # THEN it names the event and the VM (a VM name never holds '|')
    assert ended_subject(ended_key(event)) == (f"gce:{event_id}", "web-0")


@pytest.mark.parametrize("key", ["command:abc", "proof|doc", "ended|", "ended|no-vm", "ended||web-0", "ended|gce:e|"])
def test_a_key_that_is_not_an_end_gives_nothing(key: str) -> None:
    assert ended_subject(key) is None
