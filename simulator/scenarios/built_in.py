"""The built-in scenarios, written in the scenario file format and validated like files.

They are data, kept apart from the code that loads and runs them; `mbridge simulate --help` lists
them with their descriptions.
"""

from __future__ import annotations

from collections.abc import Mapping

LIVE_MIGRATION_EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"  # the documented example's EventId

BUILT_IN: dict[str, dict[str, object]] = {
    "azure-live-migration": {
        "description": "The documented example: a memory-preserving live migration freezes WestNO_0 and "
        "WestNO_1 for 5 s (incarnations 1 empty, 2 Scheduled, 3 Started, 4 empty).",
        "cloud": "azure",
        "vms": ["WestNO_0", "WestNO_1"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Freeze",
                    "event_id": LIVE_MIGRATION_EVENT_ID,
                    "resources": ["$0", "$1"],
                    "event_source": "Platform",
                    "duration_seconds": 5,
                    "description": "Virtual machine is being paused because of a memory-preserving "
                    "Live Migration operation.",
                },
            }
        ],
    },
    "azure-user-reboot": {
        "description": "A user restarts the VM from the portal: Reboot with EventSource User, 15 min notice.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Reboot",
                    "event_id": "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7",
                    "resources": ["$0"],
                    "event_source": "User",
                    "description": "Virtual machine is going to be restarted as requested by authorized user.",
                },
            }
        ],
    },
    "azure-redeploy": {
        "description": "Platform maintenance moves the VM to another host: Redeploy, 10 min notice.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Redeploy",
                    "event_id": "F020BA2E-3BC0-4C40-A10B-86575A9EABD5",
                    "resources": ["$0"],
                    "event_source": "Platform",
                    "description": "Host server is undergoing maintenance.",
                },
            }
        ],
    },
    "azure-preempt": {
        "description": "A Spot VM is evicted: Preempt with 30 s notice; the VM is deleted once it started.",
        "cloud": "azure",
        "vms": ["spot-vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Preempt",
                    "event_id": "602D9444-D2CD-49C7-8624-8643E7171297",
                    "resources": ["$0"],
                    "event_source": "Platform",
                },
            }
        ],
    },
    "azure-vmss-terminate": {
        "description": "A scale-in deletes one scale set instance: Terminate (notBeforeTimeout 10 min) "
        "for that instance only, seen by every instance of the placement group; that instance is deleted once "
        "it started, the others see the event removed.",
        "cloud": "azure",
        "vms": ["myScaleSet_0", "myScaleSet_1"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Terminate",
                    "event_id": "3A5B8C2D-6E7F-4A1B-9C0D-1E2F3A4B5C6D",
                    "resources": ["$0"],
                    "event_source": "User",
                    "notice": 600,
                },
            }
        ],
    },
    "azure-canceled": {
        "description": "Azure judges a Redeploy too risky and cancels it while Scheduled (the event vanishes).",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Redeploy",
                    "event_id": "9B2E4F6A-1C3D-4E5F-8A7B-6C5D4E3F2A1B",
                    "resources": ["$0"],
                    "event_source": "Platform",
                },
            },
            {"at": 360, "cancel": "9B2E4F6A-1C3D-4E5F-8A7B-6C5D4E3F2A1B"},
        ],
    },
    "azure-hardware-failure": {
        "description": "The host fails: a Reboot appears already Started, with no notice and NotBefore blank.",
        "cloud": "azure",
        "vms": ["vm-0"],
        "steps": [
            {
                "at": 60,
                "add": {
                    "event_type": "Reboot",
                    "event_id": "E4D3C2B1-A0F9-4E8D-B7C6-5A4B3C2D1E0F",
                    "resources": ["$0"],
                    "status": "Started",
                    "event_source": "Platform",
                    "description": "Virtual machine is being restarted because its host had a hardware failure.",
                },
            }
        ],
    },
    "gce-live-migrate": {
        "description": "maintenance-event MIGRATE_ON_HOST_MAINTENANCE 60 s before a live migration of "
        "about 10 s, then NONE.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {"at": 60, "gce": {"vm": "$0", "key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"}},
            {"at": 130, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
        ],
    },
    "gce-host-terminate": {
        "description": "A VM that cannot live-migrate (GPU): TERMINATE_ON_HOST_MAINTENANCE 60 min before "
        "the host maintenance, NONE about 60 s after it begins.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {"at": 60, "gce": {"vm": "$0", "key": "maintenance-event", "value": "TERMINATE_ON_HOST_MAINTENANCE"}},
            {"at": 3720, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
        ],
    },
    "gce-upcoming": {
        "description": "upcoming-maintenance announces a window 1 h ahead (PENDING, canReschedule); at the "
        "window start it turns ONGOING and a live migration follows, then both clear.",
        "cloud": "gce",
        "vms": ["gce-vm-0"],
        "steps": [
            {
                "at": 60,
                "gce": {
                    "vm": "$0",
                    "key": "upcoming-maintenance",
                    "value": {
                        "maintenanceType": "SCHEDULED",
                        "canReschedule": True,
                        "maintenanceStatus": "PENDING",
                        "window_start_in": 3600,
                        "window_length": 14400,
                    },
                },
            },
            {"at": 3660, "gce": {"vm": "$0", "key": "upcoming-maintenance", "value": {"maintenanceStatus": "ONGOING"}}},
            {"at": 3660, "gce": {"vm": "$0", "key": "maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"}},
            {"at": 3730, "gce": {"vm": "$0", "key": "maintenance-event", "value": "NONE"}},
            {"at": 3730, "gce": {"vm": "$0", "key": "upcoming-maintenance", "value": None}},
        ],
    },
    "gce-preempt": {
        "description": "A Spot / preemptible VM is preempted: preempted turns TRUE, and the VM shuts down 30 s later.",
        "cloud": "gce",
        "vms": ["gce-spot-0"],
        "steps": [{"at": 60, "gce": {"vm": "$0", "key": "preempted", "value": "TRUE"}}],
    },
}

SCENARIO_NAMES: tuple[str, ...] = tuple(BUILT_IN)


def describe_scenarios() -> Mapping[str, str]:
    """Name -> one-line description of every built-in scenario (for --help and errors)."""
    return {name: str(body.get("description", "")) for name, body in BUILT_IN.items()}
