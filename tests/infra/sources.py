"""Load the infrastructure sources as data: Terraform with python-hcl2, Bicep with pycep.

No provider or compiler is needed: these are the parsers checkov itself uses, so a file that
loads here is one checkov can read too. Terraform strings come back without their quotes.
"""

from __future__ import annotations

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


def terraform_outputs(module: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    return {name: body for block in module.get("output", []) for name, body in block.items()}


def load_bicep(path: Path) -> dict[str, Any]:
    """The pycep document of one Bicep file: `parameters`, `resources`, `modules`, `outputs`, ..."""
    return dict(BicepParser().parse(file_path=path))
