"""GCE metadata as a VM sees it under /computeMetadata/v1/, with ETags and `wait_for_change` long-polls.

Values change only through the control API or scenario steps (`GceState.apply`). The modules: the
simulated project (project), the values and a change to them (values, changes), their per-VM state
(state), what a path answers (answers), and the server's request handling (api). The names the
rest of the simulator, the tests and the scripts use are exported here.
"""

from __future__ import annotations

from simulator.gce_api.api import IDENTITY_PATH, GceApi
from simulator.gce_api.changes import parse_gce_change
from simulator.gce_api.project import PREFIX, PROJECT_ID, PROJECT_NUMBER, ZONE, instance_id
from simulator.gce_api.state import GceState
from simulator.gce_api.values import GceChange

__all__ = [
    "IDENTITY_PATH",
    "PREFIX",
    "PROJECT_ID",
    "PROJECT_NUMBER",
    "ZONE",
    "GceApi",
    "GceChange",
    "GceState",
    "instance_id",
    "parse_gce_change",
]
