"""The Bicep of infra/azure/ against Azure's published Bicep type definitions (scripts/bicep_types).

GIVEN the resource declarations read with pycep's grammar, and the committed subset of
      Azure/bicep-types-az (tests/infra/fixtures/bicep-types)
WHEN  every property a declaration sets is compared with the definitions of its Type@apiVersion
THEN  the real Bicep checks clean, and each kind of defect planted in a copy is refused with a
      message that names the file, the line, the resource, the property and the fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from scripts.bicep_types import check, extract
from scripts.bicep_types.definitions import FIXTURE, Definitions
from tests.infra.sources import BICEP_DIR

STORAGE = BICEP_DIR / "modules" / "storage.bicep"
FINDING = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+): resource '(?P<symbol>[^']+)' \((?P<type>[^)]+)\): (?P<path>[^:]+): .+ — .+$"
)


@pytest.fixture(scope="module")
def definitions() -> Definitions:
    return Definitions(FIXTURE)


def findings_in(tmp_path: Path, definitions: Definitions, text: str) -> list[check.Finding]:
    path = tmp_path / "planted.bicep"
    path.write_text(text, encoding="utf-8")
    return check.check_file(path, definitions)


def storage_with(old: str, new: str) -> str:
    """storage.bicep with one line changed: the planted defect sits among real declarations."""
    text = STORAGE.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"storage.bicep no longer has exactly one {old!r}: update the test"
    return text.replace(old, new)


def test_the_real_bicep_matches_the_definitions(definitions: Definitions) -> None:
    files = check.bicep_files([BICEP_DIR])
    assert BICEP_DIR / "main.bicep" in files
    assert len(files) > 1, "the modules are checked too"
    findings = check.check_paths([BICEP_DIR], definitions)
    assert not findings, "\n".join(check.render(findings))


def test_every_declared_type_is_in_the_fixture(definitions: Definitions) -> None:
    declared = extract.declared_types([BICEP_DIR])
    assert declared, "no resource declarations found"
    missing = sorted(written for written in declared.values() if definitions.resource(*written.split("@")) is None)
    assert not missing, f"not in the fixture, regenerate it (see {FIXTURE / 'README.md'}): {missing}"


def test_the_fixture_names_its_source_commit() -> None:
    source = (FIXTURE / "SOURCE").read_text(encoding="utf-8")
    assert "repository: https://github.com/Azure/bicep-types-az" in source
    assert re.search(r"^commit: [0-9a-f]{40}$", source, re.MULTILINE), source
    assert "command: python -m scripts.bicep_types.extract" in source
    listed = re.findall(r"^  generated/(\S+/types\.json)$", source, re.MULTILINE)
    extracted = sorted(str(path.relative_to(FIXTURE)) for path in FIXTURE.glob("*/*/*/types.json"))
    assert sorted(listed) == extracted


def test_the_fixture_is_self_contained(definitions: Definitions) -> None:
    """Every reference resolves within its file, and the index points at the resource types it names."""
    index = json.loads((FIXTURE / "index.json").read_text(encoding="utf-8"))["resources"]
    for name, reference in index.items():
        file, _, number = reference["$ref"].partition("#/")
        node = json.loads((FIXTURE / file).read_text(encoding="utf-8"))[int(number)]
        assert node["$type"] == "ResourceType"
        assert node["name"] == name
    for path in FIXTURE.glob("*/*/*/types.json"):
        types = json.loads(path.read_text(encoding="utf-8"))
        assert all(0 <= target < len(types) for target in extract.references(types)), path


PLANTED: list[Any] = [
    pytest.param(
        ("allowSharedKeyAccess: false", "allowSharedKeyAcess: false"),
        "properties.allowSharedKeyAcess",
        "is not a property of",
        "did you mean 'allowSharedKeyAccess'?",
        id="misspelt-property",
    ),
    pytest.param(
        ("    supportsHttpsTrafficOnly: true", "    SupportsHttpsTrafficOnly: true"),
        "properties.SupportsHttpsTrafficOnly",
        "'SupportsHttpsTrafficOnly' is not spelt as the definitions spell it",
        "write 'supportsHttpsTrafficOnly'",
        id="property-casing",
    ),
    pytest.param(
        ("    accessTier: 'Hot'", "    accessTier: 'Hot'\n    creationTime: '2024-01-01T00:00:00Z'"),
        "properties.creationTime",
        "'creationTime' is read-only (Azure sets it)",
        "remove it",
        id="read-only-property",
    ),
    pytest.param(
        ("accessTier: 'Hot'", "accessTier: 'Warm'"),
        "properties.accessTier",
        "'Warm' is not an allowed value",
        "use one of 'Hot', 'Cool', 'Premium', 'Cold'",
        id="value-outside-enum",
    ),
    pytest.param(
        ("publicAccess: 'None'", "publicAccess: 'none'"),
        "properties.publicAccess",
        "'none' is not spelt as the definitions spell it",
        "write 'None'",
        id="enum-value-casing",
    ),
    pytest.param(
        (
            "      days: 7\n    }\n    containerDeleteRetentionPolicy",
            "      days: '7'\n    }\n    containerDeleteRetentionPolicy",
        ),
        "properties.deleteRetentionPolicy.days",
        "a string '7' is given; the definitions want int",
        "write 7 without quotes",
        id="string-for-int",
    ),
    pytest.param(
        ("defaultToOAuthAuthentication: true", "defaultToOAuthAuthentication: 'true'"),
        "properties.defaultToOAuthAuthentication",
        "a string 'true' is given; the definitions want bool",
        "write true without quotes",
        id="string-for-bool",
    ),
    pytest.param(
        ("storageAccounts@2023-05-01' = {", "storageAccounts@2023-05-32' = {"),
        "apiVersion",
        "2023-05-32 is not a published API version of Microsoft.Storage/storageAccounts",
        "python -m scripts.bicep_types.extract",
        id="unknown-api-version",
    ),
    pytest.param(
        ("'Microsoft.Storage/storageAccounts@2023-05-01' = {", "'Microsoft.Storage/storageAcounts@2023-05-01' = {"),
        "type",
        "'Microsoft.Storage/storageAcounts' is not a resource type in the type definitions",
        "regenerate the definitions",
        id="unknown-resource-type",
    ),
    pytest.param(
        ("  parent: tableService\n  name: stateTableName\n", "  parent: tableService\n"),
        "name",
        "required by the definitions but not set",
        "set it",
        id="required-property-missing",
    ),
    pytest.param(
        ("  parent: account\n  name: 'default'\n  properties", "  parent: account\n  name: 'defaults'\n  properties"),
        "name",
        "'defaults' is not an allowed value",
        "write 'default'",
        id="fixed-child-name",
    ),
]


@pytest.mark.parametrize(("change", "prop", "problem", "fix"), PLANTED)
def test_a_planted_defect_is_refused(
    tmp_path: Path, definitions: Definitions, change: tuple[str, str], prop: str, problem: str, fix: str
) -> None:
    findings = findings_in(tmp_path, definitions, storage_with(*change))
    assert len(findings) == 1, "\n".join(check.render(findings))
    [finding] = findings
    assert finding.property == prop
    assert problem in finding.problem
    assert fix in finding.fix
    # The finding points at the first line changed, or for a missing property at the declaration.
    planted = (tmp_path / "planted.bicep").read_text(encoding="utf-8").splitlines()
    original = STORAGE.read_text(encoding="utf-8").splitlines()
    changed = next(number for number, (old, new) in enumerate(zip(original, planted), 1) if old != new)
    if "required" in problem:
        changed = max(number for number in range(1, changed) if planted[number - 1].startswith("resource "))
    assert finding.line == changed


SNIPPETS: list[Any] = [
    pytest.param(
        """
param tlsVersion int = 2
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'abcdefgh'
  location: 'westeurope'
  kind: 'StorageV2'
  sku: { name: 'Standard_ZRS' }
  properties: {
    minimumTlsVersion: tlsVersion
  }
}
""",
        "properties.minimumTlsVersion",
        "`tlsVersion` is of type int; the definitions want string",
        id="parameter-of-the-wrong-type",
    ),
    pytest.param(
        """
@allowed(['Allow', 'Permit'])
param action string
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'abcdefgh'
  location: 'westeurope'
  kind: 'StorageV2'
  sku: { name: 'Standard_ZRS' }
  properties: {
    networkAcls: {
      defaultAction: 'Deny'
      ipRules: [for ip in ['192.0.2.1']: {
        value: ip
        action: action
      }]
    }
  }
}
""",
        "properties.networkAcls.ipRules[*].action",
        "'Permit' is not an allowed value",
        id="allowed-parameter-value-in-a-loop-body",
    ),
    pytest.param(
        """
param enabled bool
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = [for i in range(0, 2): {
  name: 'abcdefgh${i}'
}]
resource blobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = [for i in range(0, 2): if (enabled) {
  parent: account[i]
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      dayz: 7
    }
  }
}]
""",
        "properties.deleteRetentionPolicy.dayz",
        "is not a property of",
        id="conditional-resource-in-a-loop",
    ),
    pytest.param(
        """
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: 'abcdefgh'

  resource tables 'tableServices' = {
    name: 'default'
    properties: {
      kors: {}
    }
  }
}
""",
        "properties.kors",
        "is not a property of",
        id="nested-child-resource",
    ),
    pytest.param(
        """
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: 'abcdefgh'
  location: 'westeurope'
}
""",
        "location",
        "an `existing` declaration only names the resource",
        id="existing-resource-sets-a-property",
    ),
    pytest.param(
        """
param useHot bool
resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'abcdefgh'
  location: 'westeurope'
  kind: 'StorageV2'
  sku: { name: 'Standard_ZRS' }
  properties: {
    accessTier: useHot ? 'Hot' : 'Warm'
  }
}
""",
        "properties.accessTier",
        "'Warm' is not an allowed value",
        id="conditional-expression-branch",
    ),
]


@pytest.mark.parametrize(("text", "prop", "problem"), SNIPPETS)
def test_a_planted_snippet_is_refused(
    tmp_path: Path, definitions: Definitions, text: str, prop: str, problem: str
) -> None:
    findings = findings_in(tmp_path, definitions, text)
    assert [(finding.property, problem in finding.problem) for finding in findings] == [(prop, True)], "\n".join(
        check.render(findings)
    )


def test_a_file_pycep_cannot_parse_is_a_finding_not_a_skip(tmp_path: Path, definitions: Definitions) -> None:
    """pycep-parser 0.5.1 does not know `fail()`: the file is reported where parsing stops."""
    text = "resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'abcdefgh'\n"
    text += "  properties: {\n    accessTier: fail('no')\n  }\n}\n"
    findings = findings_in(tmp_path, definitions, text)
    assert [(finding.line, finding.property) for finding in findings] == [(4, "(file)")]
    assert "not checked: pycep cannot parse it" in findings[0].problem
    assert findings[0].render().startswith(f"{tmp_path / 'planted.bicep'}:4: (file): not checked:")


def test_the_command_prints_one_line_per_finding_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "modules").mkdir()
    (tmp_path / "main.bicep").write_text(storage_with("accessTier: 'Hot'", "accessTier: 'Warm'"))
    (tmp_path / "modules" / "other.bicep").write_text(storage_with("kind: 'StorageV2'", "Kind: 'StorageV2'"))
    assert check.main([str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        assert FINDING.match(line), line
    assert "main.bicep" in lines[0]
    assert "resource 'account' (Microsoft.Storage/storageAccounts@2023-05-01): properties.accessTier:" in lines[0]
    assert "other.bicep" in lines[1]


def test_the_command_passes_on_the_real_bicep(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main([str(BICEP_DIR)]) == 0
    assert "match the type definitions" in capsys.readouterr().out
