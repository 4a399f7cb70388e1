"""Load the infrastructure sources as data: Terraform with python-hcl2, Bicep with pycep.

No provider or compiler is needed: these are the parsers checkov itself uses, so a file that
loads here is one checkov can read too. Terraform strings come back without their quotes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hcl2
from pycep import BicepParser

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"
BICEP_DIR = INFRA / "azure"
TERRAFORM_GCP = INFRA / "terraform" / "gcp"
TERRAFORM_AZURE = INFRA / "terraform" / "azure"
AGENT_INSTALL = INFRA / "agent"

_HCL_OPTIONS = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)


def load_terraform(directory: Path) -> dict[str, list[Any]]:
    """Every top-level block of the `.tf` files of one module directory, merged by block type.

    `resource` and `data` become `{type: {name: body}}` maps; the other block types keep
    python-hcl2's list form.
    """
    merged: dict[str, list[Any]] = {}
    files = sorted(directory.glob("*.tf"))
    if not files:
        raise FileNotFoundError(f"no .tf files in {directory}")
    for path in files:
        parsed = hcl2.loads(path.read_text(encoding="utf-8"), serialization_options=_HCL_OPTIONS)
        for block_type, blocks in parsed.items():
            merged.setdefault(block_type, []).extend(blocks)
    return merged


def terraform_resources(module: dict[str, list[Any]], kind: str = "resource") -> dict[str, dict[str, Any]]:
    """`{"google_pubsub_topic.events": body, ...}` for every resource (or data source) of a module."""
    found: dict[str, dict[str, Any]] = {}
    for block in module.get(kind, []):
        for resource_type, named in block.items():
            for name, body in named.items():
                found[f"{resource_type}.{name}"] = body
    return found


def terraform_variables(module: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    return {name: body for block in module.get("variable", []) for name, body in block.items()}


def assert_agent_package_is_pinned(variable: Mapping[str, Any], extra: str) -> None:
    """A Terraform `agent_package` variable: no default, and a validation that takes only the one-line
    form of infra/agent/install-agent.sh that needs nothing else from the network, the agent's artifact
    `<URL of the .pex>#sha256=<hex>` (or nothing: the example VMs are optional). Its regex is run here as
    Terraform runs it (RE2; the pattern uses nothing Python reads otherwise)."""
    assert variable["default"] == ""
    [validation] = variable["validation"]
    found = re.search(r'regex\("((?:[^"\\]|\\.)*)", var\.agent_package\)', validation["condition"])
    assert found, validation["condition"]
    assert 'var.agent_package == ""' in validation["condition"]
    rule = re.compile(found.group(1).replace("\\\\", "\\"))
    bus = extra.removeprefix("agent-")
    artifact = f"https://storage.example.com/agent/mbridge-agent-{bus}-0.1.0.pex"
    wheel = "https://storage.example.com/agent/maintenance_bridge-0.1.0-py3-none-any.whl"
    assert rule.fullmatch(f"{artifact}#sha256={'ab' * 32}")
    assert rule.fullmatch(f"file:///opt/agent/mbridge-agent-{bus}-0.1.0.pex#sha256={'0' * 64}")
    refused = [
        artifact,  # no hash
        f"{artifact}#sha256={'a' * 63}",
        f"{artifact}#sha256={'a' * 64}\nMBRIDGE_OTHER=1",
        f"maintenance-bridge[{extra}] @ {wheel}#sha256={'a' * 64}",  # a wheel: pip would fetch its dependencies
        "maintenance-bridge[functions-azure]",  # unpinned, and the function apps' extra
        "maintenance-bridge[functions-gcp]",
        f"maintenance-bridge[{extra}]",
        f"maintenance-bridge[{extra}]==0.1.0",  # pinned, but needs PIP_INDEX_URL, which one line cannot carry
        f"maintenance-bridge[{extra}] @ {wheel}",  # no hash
        f"maintenance-bridge[{extra}] @ {wheel}#sha256={'a' * 63}",
        f"maintenance-bridge[{extra}] @ {wheel.replace('-py3-none-any.whl', '.tar.gz')}#sha256={'a' * 64}",
        f"someone-else[{extra}] @ {wheel}#sha256={'a' * 64}",
        f"maintenance-bridge[{extra}] @ {wheel}#sha256={'a' * 64}\nMBRIDGE_OTHER=1",
    ]
    for value in refused:
        assert not rule.fullmatch(value), value
    assert "unpinned" in validation["error_message"]


def terraform_outputs(module: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    return {name: body for block in module.get("output", []) for name, body in block.items()}


def load_bicep(path: Path) -> dict[str, Any]:
    """The pycep document of one Bicep file: `parameters`, `resources`, `modules`, `outputs`, ..."""
    return dict(BicepParser().parse(file_path=path))
