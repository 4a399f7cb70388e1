"""The extras: a VM installs its bus client only, the function apps their cloud's SDKs, the demo
what it imports (tests/e2e/test_demo.py runs the demo under tests/e2e/import_guard.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
IMPORT_GUARD = ROOT / "tests" / "e2e" / "import_guard.py"
FUNCTION_ONLY = {
    "azure-functions",
    "azure-mgmt-network",
    "azure-mgmt-compute",
    "azure-data-tables",
    "google-cloud-compute",
    "google-cloud-firestore",
    "functions-framework",
}


def extras() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {
        name: {canonicalize_name(Requirement(line).name) for line in lines}
        for name, lines in project["optional-dependencies"].items()
    }


def test_the_extras_are_split_by_side() -> None:
    found = extras()
    # GIVEN the VM side: one bus client each, nothing of the function apps
    assert found["agent-servicebus"] == {"azure-servicebus", "azure-identity"}
    assert found["agent-pubsub"] == {"google-cloud-pubsub"}
    # AND the agent's span export, an extra of its own, in none of the agent's locks (its .pex)
    assert found["agent-otel"] == {
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
    }
    for lock in sorted((ROOT / "requirements").glob("agent*.txt")):
        assert "opentelemetry-exporter-otlp" not in lock.read_text(encoding="utf-8"), lock.name
    # AND the function side: each cloud's SDKs
    assert {"azure-functions", "azure-mgmt-network", "azure-data-tables"} <= found["functions-azure"]
    assert {"google-cloud-compute", "google-cloud-firestore", "functions-framework"} <= found["functions-gcp"]
    # AND the demo: no cloud SDK at all
    assert not (found["demo"] & (FUNCTION_ONLY | found["agent-servicebus"] | found["agent-pubsub"]))
    # AND the old names are gone
    assert not {"azure", "gcp", "agent-azure", "agent-gcp"} & set(found)


def test_the_guard_refuses_what_the_extras_do_not_bring() -> None:
    # GIVEN the Pub/Sub transport, imported with only the demo extra's packages allowed
    refused = guarded("demo", "wire.transports.pubsub.client")
    # THEN the import fails, naming the distribution
    assert refused.returncode != 0
    assert "comes from google-cloud-pubsub, which the extras given do not bring" in refused.stderr
    # AND with the VM's Pub/Sub extra it imports
    allowed = guarded("agent-pubsub", "wire.transports.pubsub.client")
    assert allowed.returncode == 0, allowed.stderr


def test_the_span_export_imports_with_its_extra_alone() -> None:
    allowed = guarded("agent-otel", "agent.otel")
    assert allowed.returncode == 0, allowed.stderr


def guarded(extra: str, module: str) -> subprocess.CompletedProcess[str]:
    """Import `module` with only what the project's dependencies and `extra` bring allowed."""
    return subprocess.run(
        [sys.executable, str(IMPORT_GUARD), extra, module], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
