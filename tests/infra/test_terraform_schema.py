"""Both Terraform roots against the real provider schemas, with `terraform validate`, offline.

GIVEN the schemas derived from the pinned prebuilt provider packages (scripts/tfschema), served by
      the schema-only plugin to a real `terraform init -backend=false` and `terraform validate`
WHEN  the roots are validated as they are, and copies of them with one planted mistake each
THEN  the roots are valid, and each mistake is rejected with Terraform's own diagnostic: a
      misspelled argument, an unknown attribute, a missing required block or argument, a value of
      the wrong type, a computed-only attribute set in configuration.

And the derivation itself, on the small tls package: attribute kinds, a block's nesting mode.

Terraform, the plugin's virtualenv (`make tfschema-venv`) and the packages (fetched on first use)
are needed: without them these tests skip by hand and fail under CI=true. Each root is initialised
once per module; every planted copy reuses that `.terraform`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.tfschema import derive, fetch, plugin, validate
from tests.infra.sources import TERRAFORM_AZURE, TERRAFORM_GCP
from tests.peers import require_peer

ROOTS = {"azure": TERRAFORM_AZURE, "gcp": TERRAFORM_GCP}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> validate.Setup:
    require_peer(shutil.which("terraform") is not None, "terraform is not on PATH")
    python = validate.DEFAULT_PLUGIN_PYTHON
    require_peer(python.is_file(), f"{python} is missing: make tfschema-venv")
    try:
        return validate.prepare(fetch.DEFAULT_CACHE, python, tmp_path_factory.mktemp("tfschema"))
    except validate.SetupError as error:
        require_peer(False, f"the provider schemas are not available: {error}")
        raise


@pytest.fixture(scope="module")
def initialised(setup: validate.Setup, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each root copied and initialised once: `{name: working directory}`."""
    workdirs = {}
    for name, root in ROOTS.items():
        workdir = validate.copy_root(root, tmp_path_factory.mktemp(f"init-{name}"))
        setup.terraform.init(workdir)
        workdirs[name] = workdir
    return workdirs


def planted(initialised: dict[str, Path], name: str, scratch: Path) -> Path:
    """A fresh copy of a root that reuses the initialised root's `.terraform` and lock file."""
    workdir = validate.copy_root(ROOTS[name], scratch)
    source = initialised[name]
    shutil.copytree(source / ".terraform", workdir / ".terraform", symlinks=True)
    shutil.copy2(source / ".terraform.lock.hcl", workdir / ".terraform.lock.hcl")
    return workdir


def edit(path: Path, anchor: str, old: str, new: str) -> None:
    """Replace the first `old` after the one occurrence of `anchor` in `path`."""
    text = path.read_text(encoding="utf-8")
    assert text.count(anchor) == 1, f"{anchor!r} is not unique in {path.name}"
    start = text.index(anchor)
    at = text.index(old, start)
    path.write_text(text[:at] + new + text[at + len(old) :], encoding="utf-8")


def remove_block(path: Path, anchor: str, header: str) -> None:
    """Remove the nested block opened by `header` (e.g. `site_config {`) after `anchor`."""
    text = path.read_text(encoding="utf-8")
    assert text.count(anchor) == 1, f"{anchor!r} is not unique in {path.name}"
    start = text.index(header, text.index(anchor))
    depth, end = 0, start
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0 and text[end] == "}":
            break
    path.write_text(text[:start] + text[end + 1 :], encoding="utf-8")


def errors(setup: validate.Setup, workdir: Path) -> list[validate.Diagnostic]:
    return validate.errors_in(setup.terraform.validate(workdir))


def assert_only_error(found: list[validate.Diagnostic], summary: str, detail: str) -> None:
    described = "\n".join(str(d) for d in found)
    assert len(found) == 1, described
    assert found[0].summary == summary, described
    assert detail in found[0].detail, described


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_root_is_valid(setup: validate.Setup, initialised: dict[str, Path], name: str) -> None:
    diagnostics = setup.terraform.validate(initialised[name])
    assert validate.errors_in(diagnostics) == [], "\n".join(str(d) for d in diagnostics)


def test_misspelled_argument_is_rejected(setup: validate.Setup, initialised: dict[str, Path], tmp_path: Path) -> None:
    workdir = planted(initialised, "azure", tmp_path)
    edit(workdir / "main.tf", '"${var.name_prefix}-func-id"', "tags ", "tagz ")
    assert_only_error(errors(setup, workdir), "Unsupported argument", 'An argument named "tagz" is not expected here.')


def test_unknown_attribute_of_a_resource_is_rejected(
    setup: validate.Setup, initialised: dict[str, Path], tmp_path: Path
) -> None:
    workdir = planted(initialised, "gcp", tmp_path)
    (workdir / "planted.tf").write_text(
        'output "planted" {\n  value = google_pubsub_topic.commands[0].nmae\n}\n', encoding="utf-8"
    )
    assert_only_error(
        errors(setup, workdir),
        "Unsupported attribute",
        'This object has no argument, nested block, or exported attribute named "nmae".',
    )


def test_unknown_attribute_of_a_nested_block_is_rejected(
    setup: validate.Setup, initialised: dict[str, Path], tmp_path: Path
) -> None:
    """A computed attribute inside a block is known (principal_id), a misspelled one is not."""
    workdir = planted(initialised, "azure", tmp_path)
    (workdir / "planted.tf").write_text(
        'output "known" {\n  value = azurerm_function_app_flex_consumption.this.identity[0].tenant_id\n}\n'
        'output "planted" {\n  value = azurerm_function_app_flex_consumption.this.identity[0].principal\n}\n',
        encoding="utf-8",
    )
    assert_only_error(
        errors(setup, workdir),
        "Unsupported attribute",
        'This object has no argument, nested block, or exported attribute named "principal".',
    )


@pytest.mark.parametrize(
    ("name", "file", "anchor", "block"),
    [
        ("azure", "function.tf", 'resource "azurerm_function_app_flex_consumption" "this"', "site_config"),
        ("gcp", "vm_example.tf", 'resource "google_compute_instance"', "boot_disk"),
    ],
)
def test_missing_required_block_is_rejected(
    setup: validate.Setup,
    initialised: dict[str, Path],
    tmp_path: Path,
    name: str,
    file: str,
    anchor: str,
    block: str,
) -> None:
    workdir = planted(initialised, name, tmp_path)
    remove_block(workdir / file, anchor, f"{block} {{")
    assert_only_error(
        errors(setup, workdir), f"Insufficient {block} blocks", f'At least 1 "{block}" blocks are required.'
    )


def test_wrong_type_is_rejected(setup: validate.Setup, initialised: dict[str, Path], tmp_path: Path) -> None:
    workdir = planted(initialised, "azure", tmp_path)
    edit(workdir / "main.tf", '"${var.name_prefix}-agent-id"', "= local.location", "= [local.location]")
    assert_only_error(
        errors(setup, workdir),
        "Incorrect attribute value type",
        'Inappropriate value for attribute "location": string required',
    )


def test_missing_required_argument_is_rejected(
    setup: validate.Setup, initialised: dict[str, Path], tmp_path: Path
) -> None:
    workdir = planted(initialised, "azure", tmp_path)
    edit(
        workdir / "function.tf",
        'resource "azurerm_function_app_flex_consumption"',
        'runtime_version        = "3.11"',
        "",
    )
    assert_only_error(
        errors(setup, workdir),
        "Missing required argument",
        'The argument "runtime_version" is required, but no definition was found.',
    )


def test_computed_only_attribute_is_rejected_when_set(setup: validate.Setup, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "main.tf").write_text(
        'terraform {\n  required_providers {\n    tls = { source = "hashicorp/tls" }\n  }\n}\n'
        'resource "tls_private_key" "planted" {\n  algorithm       = "ED25519"\n'
        '  public_key_pem  = "set by hand"\n}\n',
        encoding="utf-8",
    )
    setup.terraform.init(root)
    found = errors(setup, root)
    assert_only_error(found, "Invalid Configuration for Read-Only Attribute", "marked it as read-only")
    assert (found[0].filename, found[0].line) == ("main.tf", 8)  # the public_key_pem line


def test_read_only_paths_point_into_blocks() -> None:
    """The plugin's own check, as Terraform's providers do it: computed-only attributes set in
    configuration are found at any depth; null ones, optional computed ones and sets are not
    indexed."""
    block = {
        "attributes": {
            "id": {"type": "string", "optional": True, "computed": True},
            "fingerprint": {"type": "string", "computed": True},
        },
        "block_types": {
            "identity": {
                "nesting_mode": "list",
                "block": {"attributes": {"principal_id": {"type": "string", "computed": True}}},
            },
            "rule": {
                "nesting_mode": "set",
                "block": {"attributes": {"etag": {"type": "string", "computed": True}}},
            },
        },
    }
    config = {
        "id": "x",
        "fingerprint": None,
        "identity": [{"principal_id": None}, {"principal_id": "set"}],
        "rule": [{"etag": "set"}],
    }
    assert plugin.read_only_paths(block, config) == [
        [("attribute", "identity"), ("index", 1), ("attribute", "principal_id")],
        [("attribute", "rule"), ("attribute", "etag")],
    ]
    assert plugin.read_only_paths(block, {**config, "fingerprint": "set"})[0] == [("attribute", "fingerprint")]


# The derivation, on the small tls package.


@pytest.fixture(scope="module")
def tls_schema(setup: validate.Setup) -> dict[str, Any]:
    [pin] = [p for p in setup.pins if p.source == "registry.terraform.io/hashicorp/tls"]
    return derive.derive(fetch.fetch_all(fetch.DEFAULT_CACHE, [pin])[pin.source])


def test_tls_schema_names_its_provider_and_types(tls_schema: dict[str, Any]) -> None:
    assert tls_schema["source"] == "registry.terraform.io/hashicorp/tls"
    assert tls_schema["provider_version"] == "4.1.0"
    assert sorted(tls_schema["resource_schemas"]) == [
        "tls_cert_request",
        "tls_locally_signed_cert",
        "tls_private_key",
        "tls_self_signed_cert",
    ]
    assert sorted(tls_schema["data_source_schemas"]) == ["tls_certificate", "tls_public_key"]


def test_tls_attribute_kinds(tls_schema: dict[str, Any]) -> None:
    attributes = tls_schema["resource_schemas"]["tls_private_key"]["block"]["attributes"]
    assert attributes["algorithm"] == {"type": "string", "required": True}
    assert attributes["rsa_bits"]["type"] == "number"
    assert attributes["rsa_bits"]["optional"] is True
    assert attributes["private_key_pem"] == {"type": "string", "computed": True}  # computed only
    cert = tls_schema["resource_schemas"]["tls_self_signed_cert"]["block"]["attributes"]
    assert cert["allowed_uses"] == {"type": ["list", "string"], "required": True}
    assert cert["is_ca_certificate"]["type"] == "bool"


def test_tls_nested_blocks_and_computed_objects(tls_schema: dict[str, Any]) -> None:
    subject = tls_schema["resource_schemas"]["tls_cert_request"]["block"]["block_types"]["subject"]
    assert subject["nesting_mode"] == "list"
    assert "max_items" not in subject  # a validator's limit, not the schema's
    assert subject["block"]["attributes"]["common_name"] == {"type": "string", "optional": True}
    certificates = tls_schema["data_source_schemas"]["tls_certificate"]["block"]["attributes"]["certificates"]
    assert certificates["computed"] is True
    kind, element = certificates["type"]
    assert kind == "list"
    assert element[0] == "object"
    assert element[1]["is_ca"] == "bool"
    proxy = tls_schema["provider"]["block"]["block_types"]["proxy"]
    assert proxy["nesting_mode"] == "list"


def test_derivation_is_deterministic(setup: validate.Setup, tls_schema: dict[str, Any]) -> None:
    [pin] = [p for p in setup.pins if p.source == "registry.terraform.io/hashicorp/tls"]
    again = derive.derive(fetch.fetch_all(fetch.DEFAULT_CACHE, [pin])[pin.source])
    assert again == tls_schema


def iter_blocks(block: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield block
    for nested in block.get("block_types", {}).values():
        yield from iter_blocks(nested["block"])


def test_every_attribute_has_one_kind(setup: validate.Setup) -> None:
    """Across the derived schemas: each attribute is required, optional or computed-only, never
    required and optional at once, and has a type or a nested type."""
    for path in setup.schemas.values():
        schema = json.loads(path.read_text(encoding="utf-8"))
        blocks = [schema["provider"]["block"]]
        for kind in ("resource_schemas", "data_source_schemas"):
            blocks.extend(s["block"] for s in schema[kind].values())
        for top in blocks:
            for block in iter_blocks(top):
                for name, attribute in block.get("attributes", {}).items():
                    assert not (attribute.get("required") and attribute.get("optional")), name
                    assert attribute.get("required") or attribute.get("optional") or attribute.get("computed"), name
                    assert ("type" in attribute) != ("nested_type" in attribute), name
                for name in block.get("block_types", {}):
                    assert re.fullmatch(r"[a-z0-9_]+", name), name
