"""Check every resource declaration of infra/azure/ against Azure's published Bicep type definitions.

    python -m scripts.bicep_types.check [--types DIR] [BICEP_DIR ...]    (default: infra/azure)

For each resource of every `.bicep` file under the folders (main.bicep and modules/, with loop
bodies, conditional, nested and `existing` resources; module declarations are not resources and
are skipped, the module files are checked on their own), the `Type@apiVersion` must be in the
definitions (tests/infra/fixtures/bicep-types, a subset of Azure/bicep-types-az), and every
property it sets must be one the definitions declare there, spelt with their casing, not
read-only, of their basic type (string, int, bool, object, array), within their allowed values
and length or range bounds; properties the definitions require must be set.

A value computed at deployment (a parameter, variable, function call, condition, loop variable)
cannot be checked for its value, only for its name and, where it is certain, its type; the
literal values it can take where they are written down (a parameter's `@allowed` list, a
variable's literal value, the branches of `cond ? 'a' : 'b'`) are checked as values.

Each finding is printed as `file:line: resource 'symbol' (Type@api): property path: what is wrong
— what to do`; a file pycep cannot parse is one finding (`file:line: (file): not checked: ...`),
never skipped. Exit status: 0 clean, 1 findings, 2 the definitions cannot be read.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.bicep_types import bicep
from scripts.bicep_types.bicep import (
    ArrayValue,
    Expression,
    Literal,
    LoopValue,
    ObjectValue,
    Resource,
    Value,
)
from scripts.bicep_types.definitions import (
    FIXTURE,
    REGENERATE,
    REQUIRED,
    RESOURCE_READ_ONLY,
    ROOT,
    Definitions,
    FixtureError,
    Property,
    TypeRef,
)

BASICS = ("string", "int", "bool", "object", "array")
# What an `existing` declaration may set: it reads a resource, it does not describe one.
EXISTING_KEYS = frozenset({"name", "parent", "scope"})
_KINDS = {
    "StringType": {"string"},
    "StringLiteralType": {"string"},
    "IntegerType": {"int"},
    "BooleanType": {"bool"},
    "ObjectType": {"object"},
    "DiscriminatedObjectType": {"object"},
    "ArrayType": {"array"},
    "AnyType": set(BASICS),
    "NullType": set(),
}


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    symbol: str
    type_key: str
    property: str
    problem: str
    fix: str

    def render(self) -> str:
        if not self.symbol:  # the file as a whole
            return f"{_shown(self.path)}:{self.line}: {self.property}: {self.problem} — {self.fix}"
        return (
            f"{_shown(self.path)}:{self.line}: resource '{self.symbol}' ({self.type_key}): "
            f"{self.property}: {self.problem} — {self.fix}"
        )


def check_paths(directories: Iterable[Path], definitions: Definitions) -> list[Finding]:
    """Every finding in the `.bicep` files under the directories (a file given itself is read too)."""
    findings: list[Finding] = []
    for path in bicep_files(directories):
        findings.extend(check_file(path, definitions))
    return findings


def bicep_files(directories: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for directory in directories:
        found.extend([directory] if directory.is_file() else sorted(directory.rglob("*.bicep")))
    return found


def check_file(path: Path, definitions: Definitions, text: str | None = None) -> list[Finding]:
    try:
        parsed = bicep.read(path, text)
    except bicep.BicepSyntaxError as error:
        fix = "write it in syntax pycep-parser reads (see docs/bicep-type-check.md), or check it by hand"
        return [Finding(path, error.line, "", "", "(file)", f"not checked: {error.reason}", fix)]
    findings: list[Finding] = []
    for resource in parsed.resources:
        findings.extend(check_resource(resource, definitions))
    return findings


def check_resource(resource: Resource, definitions: Definitions) -> list[Finding]:
    ref = definitions.resource(resource.type, resource.api_version)
    if ref is None:
        return [_unknown(resource, definitions)]
    node = definitions.node(ref)
    checker = _Checker(resource, definitions)
    flags = int(node.get("flags", 0))
    writable = node.get("writableScopes")
    if not resource.existing and (flags & RESOURCE_READ_ONLY or writable == 0):
        checker.report(resource.line, "(declaration)", "this resource type can only be read", "declare it `existing`")
    checker.resource_body(definitions.follow(ref, node["body"]))
    return checker.findings


def _unknown(resource: Resource, definitions: Definitions) -> Finding:
    def finding(prop: str, problem: str, fix: str) -> Finding:
        return Finding(resource.path, resource.line, resource.symbol, resource.type_key, prop, problem, fix)

    known = definitions.known_type(resource.type)
    if known is None:
        return finding(
            "type",
            f"'{resource.type}' is not a resource type in the type definitions",
            "check the spelling against https://learn.microsoft.com/azure/templates; if it is right, "
            f"regenerate the definitions: {REGENERATE}",
        )
    spelled, published = known
    if any(version.lower() == resource.api_version.lower() for version in published):
        return finding(
            "apiVersion",
            f"{spelled}@{resource.api_version} is published but not in the extracted definitions",
            f"regenerate them: {REGENERATE}",
        )
    stable = [version for version in published if "preview" not in version]
    newest = (stable or published)[-1] if published else "none"
    return finding(
        "apiVersion",
        f"{resource.api_version} is not a published API version of {spelled}",
        f"use a published one (newest non-preview: {newest}), then regenerate the definitions if it is new: "
        f"{REGENERATE}",
    )


class _Checker:
    """The findings of one resource declaration."""

    def __init__(self, resource: Resource, definitions: Definitions) -> None:
        self.resource = resource
        self.definitions = definitions
        self.findings: list[Finding] = []

    def report(self, line: int, prop: str, problem: str, fix: str) -> None:
        self.findings.append(
            Finding(self.resource.path, line, self.resource.symbol, self.resource.type_key, prop, problem, fix)
        )

    # --- the resource body --------------------------------------------------------------------

    def resource_body(self, ref: TypeRef) -> None:
        resource = self.resource
        body = resource.body
        entries = [entry for entry in body.entries if entry.key not in bicep.LANGUAGE_KEYS]
        if resource.existing:
            for entry in entries:
                if entry.key is not None and entry.key not in EXISTING_KEYS:
                    self.report(
                        entry.line,
                        entry.key,
                        "an `existing` declaration only names the resource",
                        "remove it (only name, parent and scope are read)",
                    )
            entries = [entry for entry in entries if entry.key in EXISTING_KEYS]
        # A child resource declared without `parent:` names itself 'parent/child': its name is not
        # the last segment the definitions describe, so its value is not checked.
        unchecked: frozenset[str] = frozenset()
        if not resource.parented and resource.type.count("/") > 1:
            unchecked = frozenset(entry.key for entry in entries if entry.key == "name")
            entries = [entry for entry in entries if entry.key != "name"]
        self.object(ObjectValue(body.line, tuple(entries)), ref, "", required=not resource.existing, given=unchecked)

    # --- values -------------------------------------------------------------------------------

    def value(self, value: Value, ref: TypeRef, path: str) -> None:
        if ref == _ANY:
            return
        node = self.definitions.node(ref)
        kind = node.get("$type")
        if isinstance(value, Literal) and value.value is None:
            return  # null: the property is left out of the request
        if isinstance(value, Expression):
            self.expression(value, ref, path)
            return
        if kind == "UnionType":
            self.union(value, ref, node, path)
            return
        if kind == "AnyType":
            return
        if not self.basic_fits(value, kind, path):
            return
        if kind in ("ObjectType", "DiscriminatedObjectType") and isinstance(value, ObjectValue):
            self.object(value, ref, path)
        elif kind == "ArrayType":
            self.array(value, ref, node, path)
        elif kind == "StringLiteralType" and isinstance(value, Literal):
            self.literal(value, [str(node["value"])], path)
        elif kind == "StringType" and isinstance(value, Literal) and isinstance(value.value, str):
            self.length(value.line, path, len(value.value), node, "characters")
        elif kind == "IntegerType" and isinstance(value, Literal) and isinstance(value.value, int):
            self.bounds(value, node, path)

    def expression(self, value: Expression, ref: TypeRef, path: str) -> None:
        """A computed value: its type where certain, and the literal values written down for it."""
        wanted = self.basics(ref)
        if value.basic is not None and value.basic not in wanted:
            self.report(
                value.line,
                path,
                f"`{value.text}` is of type {value.basic}; the definitions want {_either(wanted)}",
                f"give it a value of type {_either(wanted)}",
            )
            return
        for candidate in value.candidates:
            if not (isinstance(candidate, Literal) and candidate.value is None):
                self.value(candidate, ref, path)

    def basic_fits(self, value: Value, kind: Any, path: str) -> bool:
        wanted = _KINDS.get(str(kind), set(BASICS))
        given = _basic(value)
        if given is None or given in wanted:
            return True
        shown = f"'{value.value}'" if isinstance(value, Literal) and isinstance(value.value, str) else ""
        self.report(
            value.line,
            path,
            f"{_article(given)} {shown}".rstrip() + f" is given; the definitions want {_either(wanted)}",
            _type_fix(value, wanted),
        )
        return False

    def basics(self, ref: TypeRef) -> set[str]:
        if ref == _ANY:
            return set(BASICS)
        node = self.definitions.node(ref)
        if node.get("$type") == "UnionType":
            found: set[str] = set()
            for element in node.get("elements", []):
                found |= self.basics(self.definitions.follow(ref, element))
            return found
        return set(_KINDS.get(str(node.get("$type")), set(BASICS)))

    def union(self, value: Value, ref: TypeRef, node: Mapping[str, Any], path: str) -> None:
        elements = [self.definitions.follow(ref, element) for element in node.get("elements", [])]
        wanted = self.basics(ref)
        if not self.basic_fits_set(value, wanted, path):
            return
        if isinstance(value, Literal) and isinstance(value.value, str):
            nodes = [self.definitions.node(element) for element in elements]
            if any(element.get("$type") in ("StringType", "AnyType") for element in nodes):
                return  # an open set: any string is accepted, the literals are only the known ones
            allowed = [str(element["value"]) for element in nodes if element.get("$type") == "StringLiteralType"]
            self.literal(value, allowed, path)
            return
        # An object or array: it fits if one element of the union takes it without a finding.
        best: list[Finding] | None = None
        for element in elements:
            if _basic(value) not in self.basics(element):
                continue
            trial = _Checker(self.resource, self.definitions)
            trial.value(value, element, path)
            if not trial.findings:
                return
            if best is None or len(trial.findings) < len(best):
                best = trial.findings
        self.findings.extend(best or [])

    def basic_fits_set(self, value: Value, wanted: set[str], path: str) -> bool:
        given = _basic(value)
        if given is None or given in wanted:
            return True
        self.report(
            value.line,
            path,
            f"{_article(given)} is given; the definitions want {_either(wanted)}",
            _type_fix(value, wanted),
        )
        return False

    def literal(self, value: Literal, allowed: list[str], path: str) -> None:
        if value.value in allowed:
            return
        same = [option for option in allowed if option.lower() == str(value.value).lower()]
        if same:
            self.report(
                value.line, path, f"'{value.value}' is not spelt as the definitions spell it", f"write '{same[0]}'"
            )
            return
        close = difflib.get_close_matches(str(value.value), allowed, n=1)
        if len(allowed) == 1:
            fix = f"write '{allowed[0]}', the only value allowed"
        else:
            fix = (f"did you mean '{close[0]}'? " if close else "") + f"use one of {_listed(allowed)}"
        self.report(value.line, path, f"'{value.value}' is not an allowed value", fix)

    def array(self, value: Value, ref: TypeRef, node: Mapping[str, Any], path: str) -> None:
        item = self.definitions.follow(ref, node["itemType"])
        if isinstance(value, LoopValue):
            self.value(value.body, item, f"{path}[*]")
        elif isinstance(value, ArrayValue):
            self.length(value.line, path, len(value.items), node, "items")
            for number, element in enumerate(value.items):
                self.value(element, item, f"{path}[{number}]")

    def length(self, line: int, path: str, size: int, node: Mapping[str, Any], unit: str) -> None:
        low, high = node.get("minLength"), node.get("maxLength")
        if (low is not None and size < low) or (high is not None and size > high):
            self.report(line, path, f"{size} {unit}, outside {_range(low, high)}", f"give {_range(low, high)} {unit}")

    def bounds(self, value: Literal, node: Mapping[str, Any], path: str) -> None:
        low, high = node.get("minValue"), node.get("maxValue")
        number = value.value
        assert isinstance(number, int)
        if (low is not None and number < low) or (high is not None and number > high):
            self.report(
                value.line, path, f"{number} is outside {_range(low, high)}", f"give a value in {_range(low, high)}"
            )

    # --- objects ------------------------------------------------------------------------------

    def object(
        self, value: ObjectValue, ref: TypeRef, path: str, required: bool = True, given: frozenset[str] = frozenset()
    ) -> None:
        """Each key against the properties declared; with `required`, the required ones present
        (`given` names keys set but left out of `value`)."""
        node = self.definitions.node(ref)
        if node.get("$type") == "DiscriminatedObjectType":
            properties = self.discriminated(value, ref, node, path, required)
            if properties is None:
                return
            additional = None
        else:
            properties = self.definitions.properties(ref, node.get("properties", {}))
            additional = node.get("additionalProperties")
        name = str(node.get("name", "object"))
        by_lower = {key.lower(): prop for key, prop in properties.items()}
        for entry in value.entries:
            if entry.key is None:
                continue  # an interpolated key: not known before deployment
            where = _join(path, entry.key)
            prop = properties.get(entry.key)
            if prop is None and entry.key.lower() in by_lower:
                prop = by_lower[entry.key.lower()]
                self.report(
                    entry.line, where, f"'{entry.key}' is not spelt as the definitions spell it", f"write '{prop.name}'"
                )
            if prop is None:
                if additional is not None:
                    self.value(entry.value, self.definitions.follow(ref, additional), where)
                    continue
                self.unknown_property(entry.line, where, entry.key, name, properties)
                continue
            if prop.read_only:
                self.report(entry.line, where, f"'{prop.name}' is read-only (Azure sets it)", "remove it")
                continue
            self.value(entry.value, prop.type, where)
        if required:
            present = {entry.key.lower() for entry in value.entries if entry.key is not None}
            present |= {key.lower() for key in given}
            for prop in properties.values():
                if prop.required and prop.name.lower() not in present:
                    self.report(value.line, _join(path, prop.name), "required by the definitions but not set", "set it")

    def discriminated(
        self, value: ObjectValue, ref: TypeRef, node: Mapping[str, Any], path: str, required: bool
    ) -> dict[str, Property] | None:
        """The properties of the variant the discriminator selects: base properties and the
        variant's. With a computed discriminator, every variant's properties are accepted."""
        discriminator = str(node["discriminator"])
        base = self.definitions.properties(ref, node.get("baseProperties", {}))
        variants = {key: self.definitions.follow(ref, element) for key, element in node.get("elements", {}).items()}
        # Case-insensitive here; the loop over the keys reports a casing difference.
        chosen = next((entry for entry in value.entries if (entry.key or "").lower() == discriminator.lower()), None)
        if chosen is None:
            if required:
                self.report(
                    value.line,
                    _join(path, discriminator),
                    "required by the definitions but not set",
                    f"set it to one of {_listed(list(variants))}",
                )
            return None
        selected = chosen.value
        if isinstance(selected, Literal) and isinstance(selected.value, str):
            variant = variants.get(selected.value)
            if variant is None:
                self.literal(selected, list(variants), _join(path, discriminator))
                return None
            merged = dict(base)
            merged.update(self.definitions.properties(variant, self.definitions.node(variant).get("properties", {})))
            return merged
        merged = dict(base)
        for variant in variants.values():
            declared = self.definitions.node(variant).get("properties", {})
            for key, prop in self.definitions.properties(variant, declared).items():
                # Required by one variant only: not known to be required here.
                merged.setdefault(key, Property(key, prop.type, prop.flags & ~REQUIRED, prop.description))
        merged[discriminator] = Property(discriminator, _ANY, 0, "")  # chosen at deployment
        return merged

    def unknown_property(self, line: int, where: str, key: str, name: str, properties: Mapping[str, Property]) -> None:
        writable = sorted(key for key, prop in properties.items() if not prop.read_only)
        close = difflib.get_close_matches(key, writable, n=1)
        if close:
            fix = f"did you mean '{close[0]}'?"
        elif writable:
            fix = f"remove it, or use one of {_listed(writable)}"
        else:
            fix = "remove it: this object takes no properties"
        self.report(line, where, f"'{key}' is not a property of {name} in the definitions", fix)


# A reference to "any value": the discriminator of a variant chosen at deployment.
_ANY = TypeRef("", -1)


def _basic(value: Value) -> str | None:
    if isinstance(value, Literal):
        if isinstance(value.value, bool):
            return "bool"
        if isinstance(value.value, int):
            return "int"
        return None if value.value is None else "string"
    if isinstance(value, ObjectValue):
        return "object"
    if isinstance(value, (ArrayValue, LoopValue)):
        return "array"
    return value.basic


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _type_fix(value: Value, wanted: set[str]) -> str:
    if isinstance(value, Literal) and isinstance(value.value, str):
        text = value.value.strip()
        if "int" in wanted and text.lstrip("-").isdigit():
            return f"write {text} without quotes"
        if "bool" in wanted and text.lower() in ("true", "false"):
            return f"write {text.lower()} without quotes"
    return f"give a value of type {_either(wanted)}"


def _either(kinds: Iterable[str]) -> str:
    ordered = [kind for kind in BASICS if kind in set(kinds)]
    return " or ".join(ordered) if ordered else "no value (null)"


def _listed(options: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"'{option}'" for option in options[:limit])
    return shown + (f" (and {len(options) - limit} more)" if len(options) > limit else "")


def _range(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"{low}..{high}"
    return f">= {low}" if low is not None else f"<= {high}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _shown(path: Path) -> Path:
    resolved = path.resolve()
    return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else path


def render(findings: Iterable[Finding]) -> Iterator[str]:
    for finding in sorted(findings, key=lambda f: (str(f.path), f.line, f.property)):
        yield finding.render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--types", type=Path, default=FIXTURE, help="the type definitions (the extracted subset)")
    parser.add_argument(
        "bicep", type=Path, nargs="*", default=[ROOT / "infra" / "azure"], help="Bicep folders or files"
    )
    args = parser.parse_args(argv)
    try:
        definitions = Definitions(args.types)
        findings = check_paths(args.bicep, definitions)
    except FixtureError as error:
        print(f"bicep types: {error}", file=sys.stderr)
        return 2
    for line in render(findings):
        print(line)
    files = len(bicep_files(args.bicep))
    if findings:
        print(f"bicep types: {len(findings)} finding(s) in {files} file(s)", file=sys.stderr)
        return 1
    print(f"bicep types: {files} file(s) match the type definitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
