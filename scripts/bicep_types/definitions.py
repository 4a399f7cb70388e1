"""Read the committed subset of Azure's Bicep type definitions (Azure/bicep-types-az).

The subset keeps the repository's layout and format: `index.json` maps each `Type@apiVersion`
to `{"$ref": "<provider>/<namespace>/<apiVersion>/types.json#/<n>"}`, and each `types.json` is a
JSON array of type nodes whose references `{"$ref": "#/<n>"}` point into the same array. It holds
only the resource types infra/azure/ declares and the types they reach; `versions.json` lists,
for each of those resource types, every API version the snapshot publishes, so that a version
can be told apart as misspelt (not published) or merely not extracted yet.

Node kinds read here (`$type`): ResourceType, ObjectType, DiscriminatedObjectType, ArrayType,
UnionType, StringLiteralType, StringType, IntegerType, BooleanType, NullType, AnyType.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "infra" / "fixtures" / "bicep-types"
REGENERATE = (
    "python -m scripts.bicep_types.extract --snapshot <bare git dir of Azure/bicep-types-az> infra/azure"
    " (see tests/infra/fixtures/bicep-types/README.md)"
)

# ObjectTypePropertyFlags of bicep-types (Azure.Bicep.Types.Concrete)
REQUIRED = 1 << 0
READ_ONLY = 1 << 1
WRITE_ONLY = 1 << 2
DEPLOY_TIME_CONSTANT = 1 << 3
# ResourceFlags of the older format: the type can only be read (declared `existing`)
RESOURCE_READ_ONLY = 1 << 0


class FixtureError(Exception):
    """The fixture is missing or not in the expected format."""


@dataclass(frozen=True)
class TypeRef:
    """One node of one types.json: `file` relative to the fixture root, `index` into its array."""

    file: str
    index: int


@dataclass(frozen=True)
class Property:
    name: str
    type: TypeRef
    flags: int
    description: str

    @property
    def required(self) -> bool:
        return bool(self.flags & REQUIRED) and not self.read_only

    @property
    def read_only(self) -> bool:
        return bool(self.flags & READ_ONLY)


class Definitions:
    """The fixture, read lazily: a types.json is parsed the first time a type of it is needed."""

    def __init__(self, root: Path = FIXTURE) -> None:
        self.root = root
        try:
            index = json.loads((root / "index.json").read_text(encoding="utf-8"))
            versions = json.loads((root / "versions.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise FixtureError(f"cannot read the type definitions in {root}: {error}") from error
        # Azure resource types and API versions compare without regard to case, as in Bicep.
        self._resources: dict[str, TypeRef] = {}
        for key, reference in index.get("resources", {}).items():
            file, _, pointer = str(reference["$ref"]).partition("#/")
            self._resources[key.lower()] = TypeRef(file, int(pointer))
        self._versions: dict[str, tuple[str, list[str]]] = {
            name.lower(): (name, list(published)) for name, published in versions.items()
        }
        self._files: dict[str, list[dict[str, Any]]] = {}

    def resource(self, resource_type: str, api_version: str) -> TypeRef | None:
        return self._resources.get(f"{resource_type}@{api_version}".lower())

    def known_type(self, resource_type: str) -> tuple[str, list[str]] | None:
        """The type's spelling in the definitions and every API version published for it."""
        return self._versions.get(resource_type.lower())

    def node(self, ref: TypeRef) -> dict[str, Any]:
        types = self._files.get(ref.file)
        if types is None:
            path = self.root / ref.file
            try:
                types = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as error:
                raise FixtureError(f"cannot read {path}: {error}") from error
            if not isinstance(types, list):
                raise FixtureError(f"{path}: a types.json is a JSON array of type nodes")
            self._files[ref.file] = types
        try:
            return types[ref.index]
        except IndexError as error:
            raise FixtureError(f"{ref.file}: no type #/{ref.index}") from error

    def follow(self, origin: TypeRef, reference: Mapping[str, Any]) -> TypeRef:
        """The node a `{"$ref": "#/<n>"}` written in `origin`'s file points to."""
        pointer = str(reference.get("$ref", ""))
        if not pointer.startswith("#/"):
            raise FixtureError(f"{origin.file}: only references within the file are read, not {pointer!r}")
        return TypeRef(origin.file, int(pointer[2:]))

    def properties(self, origin: TypeRef, declared: Mapping[str, Any]) -> dict[str, Property]:
        return {
            name: Property(
                name, self.follow(origin, spec["type"]), int(spec.get("flags", 0)), spec.get("description", "")
            )
            for name, spec in declared.items()
        }
