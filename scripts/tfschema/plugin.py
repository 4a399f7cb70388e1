"""A schema-only Terraform provider: serves one provider's derived schema over plugin protocol 6.

    python -m scripts.tfschema.plugin SCHEMA.json     (started by Terraform, through a launcher)

`terraform validate` needs from a provider only its schema: Terraform core itself checks each
block against it (unknown arguments and attributes, types, required arguments, block counts).
So this answers GetProviderSchema and GetMetadata from the JSON that derive.py wrote. One check
is the provider's, not core's: a computed-only attribute set in configuration. Every real
provider rejects it in Validate*Config, and so does this one, with the plugin framework's wording;
beyond that the Validate* calls return no diagnostic (the providers' own value validators, such as
allowed strings, are not in any schema). Calls a validation never makes (plan, apply, read,
import, functions) answer with an error diagnostic rather than leave Terraform waiting.

The go-plugin handshake with AutoMTLS and the controller and stdio services come from the `tf`
package (tf.runner.run_provider); its servicer is swapped for the one here, which speaks the
package's generated tfplugin6 messages. That package supports protocol 6 as generated for it:
ephemeral resources and resource identities are not part of it, so they cannot be served.

This module runs in a virtualenv of its own (`.venv-tfschema`, see docs/infra-validation.md): `tf`
pins grpcio and protobuf releases the project's own environment need not share.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Json = dict[str, Any]

# The generated protobuf modules have no type information this project's type checker can use,
# and they live in the plugin's own virtualenv, so they are loaded by name and typed as Any.
pb: Any = None
pb_grpc: Any = None


def _load_stubs() -> None:
    global pb, pb_grpc
    pb = importlib.import_module("tf.gen.tfplugin_pb2")
    pb_grpc = importlib.import_module("tf.gen.tfplugin_pb2_grpc")


_MODES = {"single": "SINGLE", "list": "LIST", "set": "SET", "map": "MAP", "group": "GROUP"}


def block_proto(block: Mapping[str, Any], version: int = 0) -> Any:
    """A tfplugin6 Schema.Block from a block of `terraform providers schema -json` form."""
    return pb.Schema.Block(
        version=version,
        attributes=[attribute_proto(name, value) for name, value in sorted(block.get("attributes", {}).items())],
        block_types=[
            pb.Schema.NestedBlock(
                type_name=name,
                block=block_proto(nested["block"]),
                nesting=getattr(pb.Schema.NestedBlock, _MODES[nested["nesting_mode"]]),
                min_items=int(nested.get("min_items", 0)),
                max_items=int(nested.get("max_items", 0)),
            )
            for name, nested in sorted(block.get("block_types", {}).items())
        ],
    )


def attribute_proto(name: str, attribute: Mapping[str, Any]) -> Any:
    message = pb.Schema.Attribute(
        name=name,
        required=bool(attribute.get("required")),
        optional=bool(attribute.get("optional")),
        computed=bool(attribute.get("computed")),
        sensitive=bool(attribute.get("sensitive")),
    )
    if "nested_type" in attribute:
        nested = attribute["nested_type"]
        message.nested_type.CopyFrom(
            pb.Schema.Object(
                attributes=[attribute_proto(n, a) for n, a in sorted(nested.get("attributes", {}).items())],
                nesting=getattr(pb.Schema.Object, _MODES[nested["nesting_mode"]]),
            )
        )
    else:
        message.type = json.dumps(attribute["type"], separators=(",", ":")).encode()
    return message


def schema_proto(schema: Mapping[str, Any]) -> Any:
    return pb.Schema(version=int(schema.get("version", 0)), block=block_proto(schema["block"]))


def provider_schema_response(schema: Mapping[str, Any]) -> Any:
    """The whole GetProviderSchema answer, built once: the large providers take a few seconds."""
    response = pb.GetProviderSchema.Response(
        provider=schema_proto(schema["provider"]),
        server_capabilities=pb.ServerCapabilities(plan_destroy=True, get_provider_schema_optional=False),
    )
    for name, value in schema.get("resource_schemas", {}).items():
        response.resource_schemas[name].CopyFrom(schema_proto(value))
    for name, value in schema.get("data_source_schemas", {}).items():
        response.data_source_schemas[name].CopyFrom(schema_proto(value))
    return response


# A path into a configuration value: ("attribute", name), ("index", n) or ("key", map key) steps.
Step = tuple[str, Any]

READ_ONLY_SUMMARY = "Invalid Configuration for Read-Only Attribute"
READ_ONLY_DETAIL = (
    "Cannot set value for this attribute as the provider has marked it as read-only. "
    "Remove the configuration line setting the value."
)


def read_only_paths(block: Mapping[str, Any], value: Any, path: list[Step] | None = None) -> list[list[Step]]:
    """Where a configuration sets an attribute the schema marks computed only.

    Terraform core accepts such a value (its decoder treats every attribute as settable); the
    provider is what rejects it, so this provider does the same. `value` is the configuration
    as decoded from msgpack: objects are dicts, lists and sets are lists, null is None, unknown
    values are extension objects (set all the same)."""
    path = path or []
    found: list[list[Step]] = []
    if not isinstance(value, dict):
        return found
    for name, attribute in block.get("attributes", {}).items():
        current = value.get(name)
        if current is None:
            continue
        read_only = attribute.get("computed") and not attribute.get("optional") and not attribute.get("required")
        if read_only:
            found.append([*path, ("attribute", name)])
        elif "nested_type" in attribute:
            nested = attribute["nested_type"]
            for key, element in _elements(nested["nesting_mode"], current):
                found.extend(read_only_paths(nested, element, [*path, ("attribute", name), *key]))
    for name, nested in block.get("block_types", {}).items():
        current = value.get(name)
        if current is None:
            continue
        for key, element in _elements(nested["nesting_mode"], current):
            found.extend(read_only_paths(nested["block"], element, [*path, ("attribute", name), *key]))
    return found


def _elements(mode: str, value: Any) -> list[tuple[list[Step], Any]]:
    """(path steps, element) of a nested value; a set's elements have no key to point at."""
    if mode == "single":
        return [([], value)]
    if mode == "map" and isinstance(value, dict):
        return [([("key", key)], element) for key, element in value.items()]
    if isinstance(value, list):
        return [([] if mode == "set" else [("index", index)], element) for index, element in enumerate(value)]
    return []


def _decode(dynamic_value: Any) -> Any:
    if dynamic_value.msgpack:
        msgpack = importlib.import_module("msgpack")
        return msgpack.unpackb(dynamic_value.msgpack, raw=False, strict_map_key=False)
    if dynamic_value.json:
        return json.loads(dynamic_value.json)
    return None


def _read_only_diagnostics(block: Mapping[str, Any] | None, config: Any) -> list[Any]:
    if block is None:
        return []
    diagnostics = []
    for path in read_only_paths(block, _decode(config)):
        fields = {"attribute": "attribute_name", "index": "element_key_int", "key": "element_key_string"}
        steps = [pb.AttributePath.Step(**{fields[kind]: step}) for kind, step in path]
        diagnostics.append(
            pb.Diagnostic(
                severity=pb.Diagnostic.ERROR,
                summary=READ_ONLY_SUMMARY,
                detail=READ_ONLY_DETAIL,
                attribute=pb.AttributePath(steps=steps),
            )
        )
    return diagnostics


def make_servicer(schema: Mapping[str, Any]) -> Any:
    """A tfplugin6 Provider servicer answering from `schema`."""
    response = provider_schema_response(schema)

    def no_diagnostics(kind: str) -> Any:
        def handler(self: Any, request: Any, context: Any) -> Any:
            return getattr(pb, kind).Response()

        return handler

    def refuse(kind: str) -> Any:
        def handler(self: Any, request: Any, context: Any) -> Any:
            error = pb.Diagnostic(
                severity=pb.Diagnostic.ERROR,
                summary="Schema-only provider",
                detail=f"{kind} is not available: this provider only serves its schema for `terraform validate`.",
            )
            return getattr(pb, kind).Response(diagnostics=[error])

        return handler

    def get_provider_schema(self: Any, request: Any, context: Any) -> Any:
        return response

    def get_metadata(self: Any, request: Any, context: Any) -> Any:
        return pb.GetMetadata.Response(
            server_capabilities=response.server_capabilities,
            resources=[pb.GetMetadata.ResourceMetadata(type_name=n) for n in sorted(response.resource_schemas)],
            data_sources=[pb.GetMetadata.DataSourceMetadata(type_name=n) for n in sorted(response.data_source_schemas)],
        )

    def block_of(kind: str, type_name: str) -> Mapping[str, Any] | None:
        found = schema.get(kind, {}).get(type_name)
        return None if found is None else found["block"]

    def validate_provider(self: Any, request: Any, context: Any) -> Any:
        diagnostics = _read_only_diagnostics(schema["provider"]["block"], request.config)
        return pb.ValidateProviderConfig.Response(diagnostics=diagnostics)

    def validate_resource(self: Any, request: Any, context: Any) -> Any:
        diagnostics = _read_only_diagnostics(block_of("resource_schemas", request.type_name), request.config)
        return pb.ValidateResourceConfig.Response(diagnostics=diagnostics)

    def validate_data_source(self: Any, request: Any, context: Any) -> Any:
        diagnostics = _read_only_diagnostics(block_of("data_source_schemas", request.type_name), request.config)
        return pb.ValidateDataResourceConfig.Response(diagnostics=diagnostics)

    def get_functions(self: Any, request: Any, context: Any) -> Any:
        return pb.GetFunctions.Response()

    methods: dict[str, Any] = {
        "GetMetadata": get_metadata,
        "GetProviderSchema": get_provider_schema,
        "GetFunctions": get_functions,
        "ValidateProviderConfig": validate_provider,
        "ValidateResourceConfig": validate_resource,
        "ValidateDataResourceConfig": validate_data_source,
        "StopProvider": no_diagnostics("StopProvider"),
    }
    for kind in (
        "ConfigureProvider",
        "UpgradeResourceState",
        "ReadResource",
        "PlanResourceChange",
        "ApplyResourceChange",
        "ImportResourceState",
        "MoveResourceState",
        "ReadDataSource",
        "CallFunction",
    ):
        if hasattr(pb, kind):
            methods[kind] = refuse(kind)
    return type("SchemaOnlyProvider", (pb_grpc.ProviderServicer,), methods)()


class _Named:
    """What tf.runner.run_provider asks of the provider object it is given besides the servicer."""

    def __init__(self, source: str) -> None:
        self.source = source

    def full_name(self) -> str:
        return self.source


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scripts.tfschema.plugin SCHEMA.json", file=sys.stderr)
        return 2
    schema = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    _load_stubs()
    servicer = make_servicer(schema)
    runner: Any = importlib.import_module("tf.runner")
    provider_module: Any = importlib.import_module("tf.provider")
    # run_provider wraps the provider it is given in tf.provider.ProviderServicer, looked up when it
    # starts: pointing that name at this servicer keeps the package's handshake and services.
    provider_module.ProviderServicer = lambda _provider: servicer
    runner.run_provider(_Named(str(schema.get("source", ""))), argv=[sys.argv[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
