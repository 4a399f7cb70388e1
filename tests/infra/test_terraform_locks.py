"""The Terraform roots' dependency locks, their version constraints and the offline validation's pins.

GIVEN each root's `.terraform.lock.hcl`, the `required_providers` of the root and of its local
      modules, and the releases scripts/tfschema validates against (providers.json)
WHEN  they are compared
THEN  every root commits a lock; it locks every provider the root and its modules require, at the
      pinned release, which every constraint admits; and no constraint admits an azurerm release
      that lacks an argument the root uses.

The offline validation (`make infra`) runs `terraform init` with the committed lock (its checksums
left out), so Terraform itself refuses a lock a constraint does not admit; this test says which of
the three disagrees, without Terraform.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts.tfschema.validate import LOCK_FILE, without_checksums
from tests.infra.sources import REPO_ROOT, TERRAFORM_AZURE, TERRAFORM_GCP, load_terraform

ROOTS = (TERRAFORM_AZURE, TERRAFORM_GCP)
PINS = REPO_ROOT / "scripts" / "tfschema" / "providers.json"
PROVIDER_BLOCK = re.compile(r'^provider "([^"]+)" \{\n(.*?)^\}', re.MULTILINE | re.DOTALL)
ATTRIBUTE = re.compile(r'^\s*(version|constraints)\s*=\s*"([^"]*)"', re.MULTILINE)
PESSIMISTIC = re.compile(r"^~>\s*(\d+)\.(\d+)(?:\.(\d+))?$")

# Arguments that exist only from an azurerm release on: (argument, file, first release).
AZURERM_FLOORS = (("rbac_authorization_enabled", "signing.tf", (4, 42)),)


def _address(source: str) -> str:
    """A provider source as a lock file names it: registry host, lower-case namespace and type."""
    parts = source.lower().split("/")
    return "/".join(parts if len(parts) == 3 else ["registry.terraform.io", *parts])


def _lock(root: Path) -> dict[str, dict[str, str]]:
    path = root / LOCK_FILE
    assert path.is_file(), f"{path.relative_to(REPO_ROOT)} is not committed"
    return {name: dict(ATTRIBUTE.findall(body)) for name, body in PROVIDER_BLOCK.findall(path.read_text())}


def _constraints(root: Path) -> dict[str, set[str]]:
    """Every provider's constraints in the root and in the local modules it calls."""
    found: dict[str, set[str]] = {}
    for directory in (root, *sorted(p.parent for p in root.glob("modules/*/versions.tf"))):
        for block in load_terraform(directory).get("terraform", []):
            for required in block.get("required_providers", []):
                for spec in required.values():
                    found.setdefault(_address(spec["source"]), set()).add(spec["version"])
    return found


def _pins() -> dict[str, str]:
    return {p["source"]: p["version"] for p in json.loads(PINS.read_text(encoding="utf-8"))["providers"]}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _admits(constraint: str, version: str) -> bool:
    """`~> X.Y` (>= X.Y, < X+1) and `~> X.Y.Z` (>= X.Y.Z, < X.Y+1), the forms these roots use."""
    match = PESSIMISTIC.match(constraint.strip())
    assert match, f"unexpected constraint form {constraint!r}"
    floor = tuple(int(g) for g in match.groups() if g is not None)
    have = _version(version)
    ceiling = (floor[0] + 1,) if len(floor) == 2 else (floor[0], floor[1] + 1)
    return have >= floor and have[: len(ceiling)] < ceiling


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.name)
def test_each_root_locks_every_required_provider_at_the_pinned_release(root: Path) -> None:
    lock, constraints, pins = _lock(root), _constraints(root), _pins()
    # THEN the lock names exactly the providers the root and its modules require
    assert sorted(lock) == sorted(constraints)
    for provider, locked in lock.items():
        # AND each at the release the offline validation checks against
        assert locked["version"] == pins[provider], f"{provider}: lock {locked['version']}, tfschema {pins[provider]}"
        # AND with the constraints of the sources, which admit that release
        assert set(locked["constraints"].split(", ")) == constraints[provider], provider
        for constraint in constraints[provider]:
            assert _admits(constraint, locked["version"]), f"{provider}: {constraint} refuses {locked['version']}"


def test_no_constraint_admits_an_azurerm_without_the_arguments_used() -> None:
    # GIVEN arguments azurerm added in a 4.x release (rbac_authorization_enabled: 4.42.0,
    # CHANGELOG-v4.md), used by the Azure root
    constraints = _constraints(TERRAFORM_AZURE)["registry.terraform.io/hashicorp/azurerm"]
    root_constraint = next(
        spec["version"]
        for block in load_terraform(TERRAFORM_AZURE)["terraform"]
        for required in block["required_providers"]
        for name, spec in required.items()
        if name == "azurerm"
    )
    for argument, file, first in AZURERM_FLOORS:
        assert re.search(rf"^\s*{argument}\s*=", (TERRAFORM_AZURE / file).read_text(), re.MULTILINE), argument
        # THEN the root's constraint admits no earlier release
        match = PESSIMISTIC.match(root_constraint)
        assert match, root_constraint
        assert (int(match[1]), int(match[2])) >= first, f"{root_constraint} admits releases without {argument}"
    assert constraints


def test_the_validation_takes_the_lock_without_its_checksums() -> None:
    lock = (
        'provider "registry.terraform.io/hashicorp/tls" {\n  version     = "4.1.0"\n  constraints = "~> 4.0"\n'
        '  hashes = [\n    "h1:abc=",\n    "zh:0123",\n  ]\n}\n'
    )
    assert without_checksums(lock) == (
        'provider "registry.terraform.io/hashicorp/tls" {\n  version     = "4.1.0"\n  constraints = "~> 4.0"\n}\n'
    )
