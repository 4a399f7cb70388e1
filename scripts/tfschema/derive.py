"""Rebuild one provider's schema from its prebuilt CDK for Terraform package.

    python -m scripts.tfschema.derive PACKAGE.tgz [--out schema.json]

A prebuilt provider package (npm format: `package/.jsii`, `package/lib/<resource>/index.js`) is
generated from the provider's own `terraform providers schema -json`, and keeps enough of it to
rebuild that schema for `terraform validate`:

- each resource, data source and ephemeral resource is a class whose constructor names its
  Terraform type (`terraformResourceType: 'tls_private_key'`), and whose base class says which of
  the three it is;
- its arguments are the entries of `synthesizeHclAttributes()` (for nested blocks, of the
  `<struct>ToHclTerraform()` function): the Terraform name, `isBlock`, the collection kind
  (`type: simple|list|set|map|struct`), and the property they read, whose jsii declaration in the
  `<X>Config` struct gives the value type and whether it is optional;
- attributes that only the provider sets (computed, not configurable) have no argument: they are
  the getters of the class (or of the block's `<struct>OutputReference` class) whose Terraform name
  is no argument, typed by the accessor they call (`getStringAttribute('id')`, `getListAttribute`,
  a `StringMap`, a complex `...List`/`...OutputReference`/`...Map` class, ...).

What the packages cannot tell exactly is approximated so that no valid configuration is rejected:

- `max_items` is 1 where the binding takes a single struct for a list or set block (the provider
  declared MaxItems 1), and unset otherwise: list sizes enforced only by validators are unknown.
- `min_items` is 1 for a list or set block the binding requires, 0 otherwise.
- optional arguments the provider also computes are marked computed where the package still has the
  generator's `// name - computed: true, optional: true` comment; either way they stay optional,
  which is all `validate` looks at.
- collections nested in collections (a list of lists) are lists: the inner kind is not recorded,
  and a list accepts whatever a set would.
- a map of arbitrary values (`anyMap`), a JSON-like `any` and an accessor of unknown shape
  (`interpolationForAttribute`) are `dynamic`, which takes any value and any attribute reference.
- the binding writes every argument that holds structs as a block; the ones the provider declares
  as attributes are told apart by their documentation, which for a real block is "<name> block.".
  Those become, for a single struct (the plugin framework's single nested attribute), a
  `nested_type` whose inner attributes are required or optional as the binding declares, and for
  a list or set (nested attributes, or SDK attributes of object type that also take block syntax)
  a list or set of objects whose every attribute is optional: Terraform then takes both the
  attribute and the block syntax, and does not insist on inner required attributes.
- a computed-only struct is an attribute of object type built from its class's getters; a
  single one the binding reads at index 0 is a list of one object (an SDK list with MaxItems 1).
- descriptions, sensitivity, deprecation and write-only flags are left out: `validate` checks
  none of them that a plan would not check again.
- provider functions are left out; ephemeral resources are derived but the plugin protocol
  version the plugin speaks cannot serve them (see plugin.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Json = dict[str, Any]

# Base classes of the generated top-level classes, and which schema map each one fills.
KINDS = {
    "TerraformResource": "resource_schemas",
    "TerraformDataSource": "data_source_schemas",
    "TerraformEphemeralResource": "ephemeral_resource_schemas",
    "TerraformProvider": "provider",
}
# The provider block's `alias` is a meta-argument that the binding carries as an argument.
PROVIDER_META = frozenset({"alias"})
# Nesting depth past which a computed object is typed `dynamic` (a guard against cycles).
MAX_DEPTH = 32

_CLASS = re.compile(r"^class (\w+) extends ([\w.]+) \{\n(.*?)^\}", re.M | re.S)
_HCL_FUNCTION = re.compile(r"^function (\w+)ToHclTerraform\(struct\) \{\n(.*?)^\}", re.M | re.S)
_ENTRY = re.compile(
    r"^\s+(\w+): \{\n\s+value: (.+),\n\s+isBlock: (true|false),\n"
    r"\s+type: \"(\w+)\",\n\s+storageClassType: \"(\w+)\",\n\s+\}",
    re.M,
)
_READS = re.compile(r"(?:this\._|struct\.)(\w+)")
_RESOURCE_TYPE = re.compile(r"terraformResourceType: '([\w-]+)'")
_GETTER = re.compile(r"^\s+get (\w+)\(\) \{\n\s+return (.+?);\n\s+\}", re.M)
_COMPLEX_FIELD = re.compile(r"_(\w+) = new ([\w.]+)\(this, \"(\w+)\"(?:, (true|false))?\)")
_COMMENT = re.compile(r"// (\w+) - computed: (true|false), optional: (true|false), required: (true|false)")
_PRIMITIVE_ACCESSOR = re.compile(r"this\.get(\w+)Attribute\('(\w+)'\)")
_DYNAMIC_ACCESSOR = re.compile(r"this\.interpolationForAttribute\('(\w+)'\)")
_DOC_LINK = re.compile(r"\w#(\w+)\}")
_SUPER_INDEXED = re.compile(r"super\([^)]*, 0\);")

# `getXAttribute` accessors and the type they read.
_ACCESSOR_TYPES: dict[str, Any] = {
    "String": "string",
    "Number": "number",
    "Boolean": "bool",
    "List": ["list", "string"],
    "NumberList": ["list", "number"],
    "BooleanList": ["list", "bool"],
    "StringMap": ["map", "string"],
    "NumberMap": ["map", "number"],
    "BooleanMap": ["map", "bool"],
    "AnyMap": "dynamic",
}
# The runtime library's map classes for computed maps.
_RUNTIME_CLASSES: dict[str, Any] = {
    "StringMap": ["map", "string"],
    "NumberMap": ["map", "number"],
    "BooleanMap": ["map", "bool"],
    "AnyMap": "dynamic",
    "StringMapList": ["list", ["map", "string"]],
    "NumberMapList": ["list", ["map", "number"]],
    "BooleanMapList": ["list", ["map", "bool"]],
    "AnyMapList": ["list", "dynamic"],
}
_PRIMITIVES = {"string": "string", "number": "number", "boolean": "bool", "any": "dynamic", "json": "dynamic"}
_NESTING = {"list": "list", "set": "set", "struct": "single", "map": "map"}


class DeriveError(Exception):
    """The package does not have the layout this derivation reads."""


@dataclass(frozen=True)
class Entry:
    """One argument as `synthesizeHclAttributes()` or `<struct>ToHclTerraform()` writes it."""

    name: str
    prop: str
    is_block: bool
    kind: str  # simple | list | set | map | struct


@dataclass
class JsClass:
    name: str
    base: str
    body: str


@dataclass
class Package:
    """What derivation reads from one package: its jsii types and its compiled modules."""

    assembly: str
    provider: Mapping[str, str]
    types: Mapping[str, Json]
    classes: dict[str, JsClass] = field(default_factory=dict)
    hcl_functions: dict[str, list[Entry]] = field(default_factory=dict)
    # jsii struct/class name (lower case) -> fqn, per module directory, to resolve names in the JS
    fqns: dict[str, str] = field(default_factory=dict)


def read_package(tarball: Path) -> Package:
    """Stream the tarball once: `.jsii`, `package.json` and every `lib/<module>/index.js`."""
    jsii: Json | None = None
    manifest: Json | None = None
    sources: list[str] = []
    with tarfile.open(tarball, mode="r|gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name
            wanted = name in ("package/.jsii", "package/package.json") or re.fullmatch(
                r"package/lib/[^/]+/index\.js", name
            )
            if not wanted:
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            data = handle.read()
            if name == "package/.jsii":
                jsii = json.loads(data)
            elif name == "package/package.json":
                manifest = json.loads(data)
            else:
                sources.append(_strip_source_map(data.decode("utf-8")))
    if jsii is None or manifest is None:
        raise DeriveError(f"{tarball}: no package/.jsii or package/package.json")
    if "types" not in jsii:
        raise DeriveError(f"{tarball}: .jsii has no types (a compressed or redirected assembly is not read)")
    provider = (manifest.get("cdktf") or {}).get("provider") or {}
    if not provider.get("name"):
        raise DeriveError(f"{tarball}: package.json names no cdktf.provider")
    package = Package(assembly=str(jsii["name"]), provider=provider, types=jsii["types"])
    for fqn, declared in package.types.items():
        package.fqns.setdefault(str(declared.get("name", "")).lower(), fqn)
    for source in sources:
        for match in _CLASS.finditer(source):
            package.classes[match.group(1)] = JsClass(match.group(1), match.group(2), match.group(3))
        for match in _HCL_FUNCTION.finditer(source):
            package.hcl_functions[match.group(1).lower()] = _entries(match.group(2))
    return package


def _strip_source_map(text: str) -> str:
    """The inline source map is as large as the module and holds nothing read here."""
    cut = text.rfind("\n//# sourceMappingURL=")
    return text if cut < 0 else text[: cut + 1]


def _entries(body: str) -> list[Entry]:
    found = []
    for match in _ENTRY.finditer(body):
        reads = _READS.findall(match.group(2))
        if not reads:
            raise DeriveError(f"argument {match.group(1)}: cannot tell which property it reads")
        found.append(Entry(match.group(1), reads[-1], match.group(3) == "true", match.group(4)))
    return found


def _synthesized(cls: JsClass) -> list[Entry]:
    start = cls.body.find("synthesizeHclAttributes()")
    return _entries(cls.body[start:]) if start >= 0 else []


class Deriver:
    """Builds schema blocks from one package."""

    def __init__(self, package: Package) -> None:
        self.package = package

    def schema(self) -> Json:
        result: Json = {
            "provider": None,
            "resource_schemas": {},
            "data_source_schemas": {},
            "ephemeral_resource_schemas": {},
        }
        for cls in sorted(self.package.classes.values(), key=lambda c: c.name):
            kind = KINDS.get(cls.base.split(".")[-1])
            if kind is None:
                continue
            type_match = _RESOURCE_TYPE.search(cls.body)
            if type_match is None:
                raise DeriveError(f"class {cls.name}: no terraformResourceType")
            block = self.top_block(cls, skip=PROVIDER_META if kind == "provider" else frozenset())
            if kind == "provider":
                result["provider"] = {"version": 0, "block": block}
            else:
                result[kind][type_match.group(1)] = {"version": 0, "block": block}
        if result["provider"] is None:
            raise DeriveError("no provider class")
        for kind in ("resource_schemas", "data_source_schemas", "ephemeral_resource_schemas"):
            result[kind] = dict(sorted(result[kind].items()))
        return result

    def top_block(self, cls: JsClass, skip: frozenset[str]) -> Json:
        config = self._config_struct(cls)
        entries = [e for e in _synthesized(cls) if e.name not in skip]
        return self.block(entries, config, cls, skip)

    def _config_struct(self, cls: JsClass) -> Json:
        fqn = self.package.fqns.get(cls.name.lower())
        declared = self.package.types.get(fqn or "")
        if not declared:
            raise DeriveError(f"class {cls.name}: not in the jsii assembly")
        for parameter in (declared.get("initializer") or {}).get("parameters", []):
            target = (parameter.get("type") or {}).get("fqn", "")
            if parameter.get("name") == "config" and target in self.package.types:
                return self.package.types[target]
        return {"properties": []}

    def block(self, entries: list[Entry], struct: Json, reader: JsClass | None, skip: frozenset[str]) -> Json:
        """A block: its arguments from `entries` (typed by `struct`), then the getters of `reader`
        that are no argument, as computed-only attributes."""
        properties = {p["name"]: p for p in struct.get("properties", [])}
        by_link = {}
        for candidate in properties.values():
            link = _DOC_LINK.search(str((candidate.get("docs") or {}).get("remarks", "")))
            if link:
                by_link[link.group(1)] = candidate
        computed_flags = _comment_flags(reader.body) if reader else {}
        attributes: Json = {}
        block_types: Json = {}
        for entry in entries:
            # A property whose name the binding's language reserves is renamed (`build` becomes
            # `buildAttribute`); its documentation link still ends in the Terraform name.
            prop = properties.get(entry.prop) or properties.get(f"{entry.prop}Attribute") or by_link.get(entry.name)
            if prop is None:
                raise DeriveError(f"argument {entry.name}: no property {entry.prop} in {struct.get('fqn')}")
            required = not prop.get("optional", False)
            if entry.is_block and not _documented_as_block(prop):
                attributes[entry.name] = self.attribute_of_structs(entry, prop, required)
                continue
            if entry.is_block:
                block_types[entry.name] = self.nested_block(entry, prop, required)
                continue
            attribute = self.argument(entry, prop)
            if required:
                attribute["required"] = True
            else:
                attribute["optional"] = True
                if computed_flags.get(entry.name):
                    attribute["computed"] = True
            attributes[entry.name] = attribute
        if reader is not None:
            for name, value_type in self.getters(reader, depth=0):
                if name in attributes or name in block_types or name in skip:
                    continue
                attributes[name] = {"type": value_type, "computed": True}
        block: Json = {}
        if attributes:
            block["attributes"] = dict(sorted(attributes.items()))
        if block_types:
            block["block_types"] = dict(sorted(block_types.items()))
        return block

    def nested_block(self, entry: Entry, prop: Json, required: bool) -> Json:
        struct_fqn, single = _struct_of(prop["type"])
        if struct_fqn is None:
            raise DeriveError(f"block {entry.name}: its property holds no struct")
        nesting = _NESTING.get(entry.kind)
        if nesting is None or nesting == "map":
            raise DeriveError(f"block {entry.name}: unexpected kind {entry.kind}")
        nested: Json = {"nesting_mode": nesting, "block": self.struct_block(struct_fqn)}
        if nesting in ("list", "set"):
            if required:
                nested["min_items"] = 1
            if single:
                nested["max_items"] = 1
        return nested

    def struct_block(self, struct_fqn: str) -> Json:
        struct = self.package.types[struct_fqn]
        name = str(struct["name"])
        entries = self.package.hcl_functions.get(name.lower(), [])
        reader = self.package.classes.get(f"{name}OutputReference")
        return self.block(entries, struct, reader, frozenset())

    def attribute_of_structs(self, entry: Entry, prop: Json, required: bool) -> Json:
        """An argument the binding writes as a block but the provider declares as an attribute
        (its summary is not "<name> block."): a plugin-framework nested attribute, or an SDK
        attribute of object type that also takes block syntax. A single struct is a `nested_type`;
        a list or set is a collection of objects whose every attribute is optional, which
        Terraform accepts in attribute and in block syntax alike."""
        struct_fqn, _single = _struct_of(prop["type"])
        if struct_fqn is None:
            raise DeriveError(f"argument {entry.name}: its property holds no struct")
        flag = {"required": True} if required else {"optional": True}
        if entry.kind == "struct":
            inner = self.struct_block(struct_fqn)
            # A nested type holds attributes only: its own nested blocks become optional objects.
            inner_attributes = dict(inner.get("attributes", {}))
            for name, nested in inner.get("block_types", {}).items():
                value_type = _lenient_object(nested["block"])
                mode = nested["nesting_mode"]
                inner_attributes[name] = {
                    "type": value_type if mode == "single" else [mode, value_type],
                    "optional": True,
                }
            nested_type = {"nesting_mode": "single", "attributes": dict(sorted(inner_attributes.items()))}
            return {"nested_type": nested_type, **flag}
        kind = "set" if entry.kind == "set" else "list"
        return {"type": [kind, _lenient_object(self.struct_block(struct_fqn))], **flag}

    def argument(self, entry: Entry, prop: Json) -> Json:
        struct_fqn, _single = _struct_of(prop["type"])
        if struct_fqn is not None:
            # Not generated by the pinned packages (their struct arguments are all block-like);
            # kept lenient should a later one write a struct as a plain attribute.
            value_type = _lenient_object(self.struct_block(struct_fqn))
            return {"type": value_type if entry.kind == "struct" else [entry.kind, value_type]}
        outer = entry.kind if entry.kind in ("list", "set") else None
        return {"type": _cty(prop["type"], outer)}

    def getters(self, cls: JsClass, depth: int) -> Iterator[tuple[str, Any]]:
        """(Terraform name, type) of each attribute getter of a generated class."""
        fields = {m.group(1): (m.group(2), m.group(3), m.group(4) == "true") for m in _COMPLEX_FIELD.finditer(cls.body)}
        for getter in _GETTER.finditer(cls.body):
            expression = getter.group(2)
            primitive = _PRIMITIVE_ACCESSOR.search(expression)
            if primitive:
                value_type = _ACCESSOR_TYPES.get(primitive.group(1), "dynamic")
                if "Fn.tolist(" in expression and isinstance(value_type, list) and value_type[0] == "list":
                    value_type = ["set", value_type[1]]
                yield primitive.group(2), value_type
                continue
            dynamic = _DYNAMIC_ACCESSOR.search(expression)
            if dynamic:
                yield dynamic.group(1), "dynamic"
                continue
            own = re.fullmatch(r"this\._(\w+)", expression)
            if own and own.group(1) in fields:
                class_name, name, wraps_set = fields[own.group(1)]
                yield name, self.complex_type(class_name, wraps_set, depth)

    def complex_type(self, class_name: str, wraps_set: bool, depth: int) -> Any:
        short = class_name.split(".")[-1]
        if "." in class_name:
            return _RUNTIME_CLASSES.get(short, "dynamic")
        if depth > MAX_DEPTH:
            return "dynamic"
        for suffix, wrap in (("OutputReference", None), ("List", "set" if wraps_set else "list"), ("Map", "map")):
            if short.endswith(suffix):
                reference = self.package.classes.get(short[: -len(suffix)] + "OutputReference")
                if reference is None:
                    return "dynamic"
                attributes = dict(sorted(self.getters(reference, depth + 1)))
                value_type = ["object", attributes]
                if wrap is None:
                    # A single struct that the binding reads at index 0 is a list of one.
                    return ["list", value_type] if _SUPER_INDEXED.search(reference.body) else value_type
                return [wrap, value_type]
        return "dynamic"


def _documented_as_block(prop: Json) -> bool:
    return str((prop.get("docs") or {}).get("summary", "")).endswith(" block.")


def _lenient_object(block: Json) -> Any:
    """The object type of a block's attributes and nested blocks, every attribute optional."""
    attributes: dict[str, Any] = {}
    for name, attribute in block.get("attributes", {}).items():
        if "type" in attribute:
            attributes[name] = attribute["type"]
        else:
            attributes[name] = "dynamic"
    for name, nested in block.get("block_types", {}).items():
        inner = _lenient_object(nested["block"])
        mode = nested["nesting_mode"]
        attributes[name] = inner if mode == "single" else [mode, inner]
    return ["object", dict(sorted(attributes.items())), sorted(attributes)]


def _comment_flags(body: str) -> dict[str, bool]:
    """`computed` of each attribute whose generator comment survived compilation."""
    return {m.group(1): m.group(2) == "true" for m in _COMMENT.finditer(body)}


def _struct_of(jsii_type: Json) -> tuple[str | None, bool]:
    """The struct a property holds, and whether it holds exactly one (not a collection)."""
    if "fqn" in jsii_type:
        fqn = str(jsii_type["fqn"])
        return (None, False) if fqn.startswith(("cdktf.", "cdktn.")) else (fqn, True)
    if "union" in jsii_type:
        for option in jsii_type["union"]["types"]:
            found, single = _struct_of(option)
            if found:
                return found, single
        return None, False
    if "collection" in jsii_type:
        found, _single = _struct_of(jsii_type["collection"]["elementtype"])
        return found, False
    return None, False


def _cty(jsii_type: Json, outer: str | None) -> Any:
    """The cty type of a jsii value type; `outer` is the collection kind the argument declared."""
    if "primitive" in jsii_type:
        return _PRIMITIVES.get(jsii_type["primitive"], "dynamic")
    if "union" in jsii_type:
        options = [
            t for t in jsii_type["union"]["types"] if t.get("fqn") not in ("cdktf.IResolvable", "cdktn.IResolvable")
        ]
        if any(t.get("primitive") == "boolean" for t in options):
            return "bool"
        return _cty(options[0], outer) if len(options) == 1 else "dynamic"
    if "collection" in jsii_type:
        collection = jsii_type["collection"]
        element = _cty(collection["elementtype"], None)
        if collection["kind"] == "map":
            return "dynamic" if element == "dynamic" else ["map", element]
        return [outer or "list", element]
    return "dynamic"


def derive(tarball: Path) -> Json:
    """The provider's schema, in the form `terraform providers schema -json` gives one provider."""
    package = read_package(tarball)
    schema = Deriver(package).schema()
    schema["format_version"] = "1.0"
    schema["source"] = str(package.provider["name"])
    schema["provider_version"] = str(package.provider.get("version", ""))
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, help="a prebuilt provider package tarball (npm format)")
    parser.add_argument("--out", type=Path, help="write the schema here (default: standard output)")
    args = parser.parse_args(argv)
    text = json.dumps(derive(args.package), sort_keys=True)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
