"""The Cloud Functions entry of the demo's Google world: `main.py`'s `on_maintenance_event`, served
by functions-framework on loopback with the demo's policy, trust file and command key, against the
emulators.

Kept apart from the world that starts it: what the function needs (installed packages, the
repository's main.py, its settings) is decided here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from functions.core.policy import Policy, PolicyError, load_policy
from mbridge.demo.emulators import FIRESTORE, PUBSUB, PeerProcess, free_port, launch
from mbridge.demo.errors import DemoSetupError
from mbridge.demo.pubsub_bus import COMMANDS_TOPIC, PROJECT
from simulator.gce_api.project import PROJECT_ID as SIM_PROJECT

FUNCTION_TARGET = "on_maintenance_event"
CENTRAL_TARGETS = ("on_central_log_entry", "on_central_tick")  # the control plane's path (main.py)
FUNCTION_STARTUP_TIMEOUT = 60.0


def policy_document(policy: Policy) -> str:
    """`policy` as the JSON document MBRIDGE_POLICY takes (docs/policy.md).

    Raises:
        DemoSetupError: the document would not read back as `policy`.
    """
    document: dict[str, Any] = {
        f.name: getattr(policy, f.name) for f in fields(Policy) if f.name not in ("pools", "maintenance_window_utc")
    }
    document["pools"] = {pool.name: {"vms": sorted(pool.vms), "max_drained": pool.max_drained} for pool in policy.pools}
    if policy.maintenance_window_utc is not None:
        document["maintenance_window_utc"] = list(policy.maintenance_window_utc)
    text = json.dumps(document, sort_keys=True)
    try:
        same = load_policy(text) == policy
    except PolicyError as exc:
        raise DemoSetupError(f"the demo's policy cannot be passed to the function: {exc}") from exc
    if not same:
        raise DemoSetupError(f"the demo's policy does not survive MBRIDGE_POLICY: {text}")
    return text


def launch_function(
    repo_root: Path,
    policy: str,
    trust_file: Path,
    signing_pem: str,
    pubsub_host: str,
    firestore_host: str,
    logs: Path,
    target: str = FUNCTION_TARGET,
) -> PeerProcess:
    """functions-framework serving `target` of `repo_root`/main.py on a free loopback port."""
    port = free_port()
    # Nothing of the caller's own MBRIDGE_* settings (instance groups, a signing key) leaks in.
    env = {name: value for name, value in os.environ.items() if not name.startswith("MBRIDGE_")}
    env.update(
        {
            "MBRIDGE_GCP_PROJECT": PROJECT,
            "MBRIDGE_PUBSUB_COMMANDS_TOPIC": COMMANDS_TOPIC,
            "MBRIDGE_READINESS_DRAIN": "true",
            "MBRIDGE_POLICY": policy,
            "MBRIDGE_TRUST_FILE": str(trust_file),
            "MBRIDGE_SIGNING_KEY": signing_pem,
            # The project of the GCE simulator's VMs: the control plane's reports of others are not ours.
            "MBRIDGE_TRUST_PROJECTS": SIM_PROJECT,
            # The simulator serves no Compute API: the tick only sweeps (the log's entries carry the notices).
            "MBRIDGE_CENTRAL_UPCOMING": "false",
            # Nor instance groups to autoheal: the demo's pools are the agents' /readyz read directly.
            "MBRIDGE_AUTOHEALER_CHECK": "false",
            PUBSUB.variable: pubsub_host,
            FIRESTORE.variable: firestore_host,
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [
        sys.executable, "-m", "functions_framework",
        "--target", target, "--signature-type", "cloudevent", "--source", str(repo_root / "main.py"),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    name = "functions-framework" if target == FUNCTION_TARGET else f"functions-framework-{target}"
    return launch(name, command, f"127.0.0.1:{port}", logs, env=env, cwd=repo_root)


def require_google_libraries(repo_root: Path) -> None:
    missing = [
        module
        for module in ("functions_framework", "google.cloud.pubsub_v1", "google.cloud.firestore")
        if _missing(module)
    ]
    if missing:
        # This interpreter's pip, by path: a bare `pip` may well install into another environment
        # (`make demo` runs from .venv-demo, which is not on the PATH).
        install = f"{shlex.quote(sys.executable)} -m pip install -e {shlex.quote(str(repo_root) + '[functions-gcp]')}"
        raise DemoSetupError(
            f"the Python packages of {', '.join(missing)} are not installed: install the Google extras with "
            f"`{install}`, or run the demo from .venv, which has them (`make venv`, then "
            "`.venv/bin/mbridge demo --bus pubsub-emulator`)"
        )
    if not (repo_root / "main.py").is_file():
        raise DemoSetupError(
            f"the Cloud Functions entry {repo_root / 'main.py'} is not there: run the demo from a checkout of the "
            "repository installed with pip install -e"
        )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True
