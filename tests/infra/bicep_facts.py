"""Read the Bicep deployment (infra/azure/) into `AzureFacts`.

Starting at main.bicep, every `module` declaration is followed into its file, with the
arguments it passes: a module's parameter stands for whatever the caller gives it (or its own
default), an `outputs.x` read stands for the module's output expression. So a value is traced
to where it is written, in whichever file that is: the function subscription's name to
main.bicep's parameter default, a role assignment's principal to the identity resource whose
`principalId` reaches it, a role assignment's scope to the resource its `scope:` names.

Nothing is evaluated that Azure computes at deployment time; such values stay references
(`functionIdentity.properties.clientId`) or the expression's text. Parameters of main.bicep
are what the person deploying sets: their default stands for them where a concrete value is
needed (a name, a SKU), never where a condition depends on them. A resource or module counts
as declared unless its condition is false for every deployment (for instance a module
argument that turns it off), which is what "conditional resources count" means here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from tests.infra.azure_facts import (
    AGENT,
    DEPLOYMENT_RESOURCE_GROUP,
    DEPLOYMENT_SUBSCRIPTION,
    DRAIN_LOAD_BALANCER,
    DRAIN_METHODS,
    DRAIN_VIRTUAL_NETWORK,
    FUNCTION,
    SCOPE_APP_INSIGHTS,
    SCOPE_AUDIT_TABLE,
    SCOPE_CENTRAL_QUEUE,
    SCOPE_COMMANDS_QUEUE,
    SCOPE_COMMANDS_TOPIC,
    SCOPE_EVENTS_TOPIC,
    SCOPE_FUNCTION_SUBSCRIPTION,
    SCOPE_LOAD_BALANCER,
    SCOPE_NIC_RESOURCE_GROUP,
    SCOPE_SIGNING_SECRET,
    SCOPE_STATE_TABLE,
    SCOPE_STORAGE_ACCOUNT,
    SCOPE_VIRTUAL_NETWORK,
    SCOPE_VM_RESOURCE_GROUPS,
    SYSTEM_TOPIC,
    TELEMETRY_REFUSED,
    TELEMETRY_SETTING,
    AzureFacts,
    IsolatedCommandsFacts,
    RoleGrant,
    VmCommandsSubscription,
    commands_entity_scope,
    commands_subscription_scope,
    vm_principal,
)
from tests.infra.sources import AGENT_INSTALL, BICEP_DIR, load_bicep

MAIN = BICEP_DIR / "main.bicep"

# Built-in role definitions by id, as documented in
# https://learn.microsoft.com/azure/role-based-access-control/built-in-roles. Roles the
# deployment must not use are listed too, so that a wrong id shows up by its name.
BUILT_IN_ROLES: dict[str, str] = {
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "76199698-9eea-4c19-bc75-cec21354c6b6": "Storage Table Data Reader",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": "Reader",
}

ROLE_ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
ROLE_DEFINITION = "Microsoft.Authorization/roleDefinitions"
NAMESPACE = "Microsoft.ServiceBus/namespaces"
TOPIC = "Microsoft.ServiceBus/namespaces/topics"
SUBSCRIPTION = "Microsoft.ServiceBus/namespaces/topics/subscriptions"
RULE = "Microsoft.ServiceBus/namespaces/topics/subscriptions/rules"
QUEUE = "Microsoft.ServiceBus/namespaces/queues"
STORAGE_ACCOUNT = "Microsoft.Storage/storageAccounts"
TABLE = "Microsoft.Storage/storageAccounts/tableServices/tables"
APP_INSIGHTS = "Microsoft.Insights/components"
KEY_VAULT_SECRET = "Microsoft.KeyVault/vaults/secrets"  # noqa: S105 (a resource type)
PLAN = "Microsoft.Web/serverfarms"
SITE = "Microsoft.Web/sites"
SCALE_SET = "Microsoft.Compute/virtualMachineScaleSets"
LOAD_BALANCER = "Microsoft.Network/loadBalancers"
VIRTUAL_NETWORK = "Microsoft.Network/virtualNetworks"
SYSTEM_TOPIC_TYPE = "Microsoft.EventGrid/systemTopics"
EVENT_SUBSCRIPTION = "Microsoft.EventGrid/systemTopics/eventSubscriptions"

CLOUD_INIT = AGENT_INSTALL / "cloud-init.yaml"
# The module that stops a deployment: its one parameter `outcome` takes 'ok' only, and the value it
# is given otherwise is the sentence the deployment error quotes.
CHECK = BICEP_DIR / "modules" / "check.bicep"
# The agent package a deployment with the example scale set must be given (no default: the installer
# takes only a pinned one); assumed unless a test sets agentPackage itself.
EXAMPLE_AGENT_PACKAGE = (
    "maintenance-bridge[agent-servicebus] @ https://example.blob.core.windows.net/agent/"
    "maintenance_bridge-0.1.0-py3-none-any.whl#sha256=" + "0" * 64
)


class ExtractionError(Exception):
    """The Bicep does not have the shape the facts are read from; the message says what is missing."""


# --- the files as deployed ------------------------------------------------------------------


@dataclass(eq=False)
class Unit:
    """One Bicep file as one deployment uses it: main.bicep, or a module with one declaration's arguments.

    Compared by identity: the same module file called twice is two units.
    """

    path: Path
    doc: dict[str, Any]
    caller: Unit | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    scope: Any = None  # the declaration's `scope:` expression, written in the caller
    condition: Any = None  # the declaration's condition, written in the caller
    # A loop declaration `[for <loop_item> in <loop_array>: ...]`, as written in the caller, and its
    # `scope:` before the loop variable is bound.
    loop_item: str | None = None
    loop_array: Any = None
    declared_scope: Any = None
    assumed: Mapping[str, Any] = field(default_factory=dict)  # main.bicep only: parameter values to assume
    _modules: dict[str, list[Unit]] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.doc.get(name) or {}
        return found

    def module(self, symbol: str) -> Unit:
        """The unit of a module declared once (not in a loop)."""
        units = self.modules(symbol)
        if "loop_type" in self.section("modules")[symbol]["config"] or len(units) != 1:
            raise ExtractionError(f"{self.path.name}: module {symbol} is declared in a loop")
        return units[0]

    def modules(self, symbol: str) -> list[Unit]:
        """The units of a module declaration: one, or for `[for item in array: ...]` one per element
        when the array is known (a parameter value assumed), else one that stands for every element
        (whatever reads the element resolves to a LoopRef)."""
        if symbol not in self._modules:
            declaration = self.section("modules")[symbol]
            config = declaration["config"]
            loop = config.get("loop_type")
            if loop is not None:
                config = {key: value for key, value in config.items() if key != "loop_type"}
            condition, config = split_condition(config)
            path = (self.path.parent / declaration["detail"]["path"]).resolve()
            arguments = config.get("params") or {}
            bindings: list[Any] = [None] if loop is None else _loop_items(self, loop)
            self._modules[symbol] = [
                Unit(
                    path=path,
                    doc=_parsed(path),
                    caller=self,
                    arguments=arguments if loop is None else _bound(arguments, _loop_variable(self, loop), item),
                    scope=config.get("scope")
                    if loop is None
                    else _bound(config.get("scope"), _loop_variable(self, loop), item),
                    condition=condition if loop is None else _bound(condition, _loop_variable(self, loop), item),
                    loop_item=None if loop is None else _loop_variable(self, loop),
                    loop_array=None if loop is None else loop["detail"].get("array_name"),
                    declared_scope=config.get("scope"),
                )
                for item in bindings
            ]
        return self._modules[symbol]

    def is_symbol(self, name: str) -> bool:
        return any(name in self.section(kind) for kind in ("parameters", "variables", "resources", "modules"))


_ANY_ELEMENT = object()


def _loop_variable(unit: Unit, loop: Mapping[str, Any]) -> str:
    """The variable of `[for item in array: ...]` or of `[for index in range(start, count): ...]`."""
    detail = loop.get("detail") or {}
    if loop.get("type") == "array" and detail.get("item_name"):
        return str(detail["item_name"])
    if loop.get("type") == "range" and detail.get("index_name") and not detail.get("item_name"):
        return str(detail["index_name"])
    raise ExtractionError(f"{unit.path.name}: only `for item in array` and `for index in range(...)` loops are read")


def _loop_items(unit: Unit, loop: Mapping[str, Any]) -> list[Any]:
    """The elements a loop runs over: the array's, or the integers of `range(start, count)`, when
    they are known; else one stand-in."""
    _loop_variable(unit, loop)
    detail = loop["detail"]
    if loop["type"] == "range":
        start, count = (deref(resolve(unit, detail[key])) for key in ("start_index", "count"))
        if type(start) is int and type(count) is int:  # not a bool
            return list(range(start, start + count))
        return [_ANY_ELEMENT]
    array = deref(resolve(unit, detail["array_name"]))
    if isinstance(array, Lit) and isinstance(array.node, list):
        return [value_of(resolve(array.unit, item)) for item in array.node]
    return [_ANY_ELEMENT]


def _bound(node: Any, name: str, item: Any) -> Any:
    """`node` with the loop (or lambda) variable `name` replaced: by the element's values when it is
    known, by a `{"loop_item": ...}` marker (resolved to a LoopRef) when it stands for every element.
    In a string, a known element's text or number takes the place of `${name}` (`${name.x}`)."""
    if isinstance(node, str):
        if node == name:
            return _element(name, item, ())
        if item is not _ANY_ELEMENT and "${" in node:
            return _interpolated(node, name, item)
        return node
    if isinstance(node, list):
        return [_bound(value, name, item) for value in node]
    if not isinstance(node, dict):
        return node
    operator = node.get("operator")
    if isinstance(operator, dict) and operator.get("type") == "property_accessor":
        chain = _accessor_chain(node)
        if chain is not None and chain[0] == name:
            return _element(name, item, tuple(chain[1]))
    return {key: _bound(value, name, item) for key, value in node.items()}


def _element(name: str, item: Any, path: tuple[str, ...]) -> Any:
    if item is _ANY_ELEMENT:
        return {"loop_item": {"name": name, "path": path}}
    value = item
    for key in path:
        if not isinstance(value, dict) or key not in value:
            # An error only if read: `contains(vm, 'topic') ? vm.topic : ...` reads it when it is there.
            return {"missing": f"the loop element {item!r} has no {'.'.join(path)}"}
        value = value[key]
    if isinstance(value, str):
        # A literal string, whatever it spells (even the name of a symbol).
        return {"literal": value}
    return value


def _interpolated(text: str, name: str, item: Any) -> Any:
    """A string with interpolations, those of the variable `name` replaced by the element's value
    where it is text or a number; the element itself for a string that is only `${name...}`."""

    def chain(inner: str) -> tuple[str, ...] | None:
        head, *names = inner.strip().split(".")
        return tuple(names) if head == name and _CHAIN.match(inner.strip()) else None

    whole = _INTERPOLATION.fullmatch(text)
    if whole and chain(whole.group(1)) is not None:
        return _element(name, item, chain(whole.group(1)) or ())

    def part(match: re.Match[str]) -> str:
        path = chain(match.group(1))
        if path is None:
            return match.group(0)
        value = _element(name, item, path)
        if isinstance(value, dict) and set(value) == {"literal"}:
            value = value["literal"]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return match.group(0)
        # Written back as the text of a Bicep string: what unescape() reads back as the value.
        return str(value).replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${")

    return _INTERPOLATION.sub(part, text)


_PARSED: dict[Path, dict[str, Any]] = {}


def _parsed(path: Path) -> dict[str, Any]:
    """pycep's document of a file, parsed once (a module file can be declared several times)."""
    if path not in _PARSED:
        _PARSED[path] = load_bicep(path)
    return _PARSED[path]


def split_condition(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """pycep wraps the body of `resource x '...' = if (c) {...}` as {condition, config}."""
    if set(config) == {"condition", "config"}:
        return config["condition"], config["config"]
    return None, config


@dataclass(frozen=True)
class Resource:
    unit: Unit
    symbol: str
    type: str
    existing: bool
    condition: Any
    config: dict[str, Any]

    def get(self, *path: str) -> Resolved:
        return resolve(self.unit, self.config, path)

    def value(self, *path: str) -> Any:
        return value_of(self.get(*path))

    def value_or_none(self, *path: str) -> Any:
        """The value at path, or None when the declaration leaves it out."""
        try:
            return self.value(*path)
        except ExtractionError:
            return None

    @property
    def name(self) -> Any:
        return self.value("name")


# --- values --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A property of a declared resource (or module) that Azure knows at deployment time: `x.id`, `x.properties.y`."""

    unit: Unit
    symbol: str
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParamRef:
    """A parameter of main.bicep: set by whoever deploys."""

    unit: Unit
    name: str
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class VarRef:
    """A variable whose value is computed at deployment time."""

    unit: Unit
    name: str


@dataclass(frozen=True, eq=False)
class Expr:
    """An expression left as written (a function call, an operator, a string with interpolations)."""

    unit: Unit
    node: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.unit is self.unit and other.node is self.node

    def __hash__(self) -> int:
        return hash((id(self.unit), id(self.node)))


@dataclass(frozen=True, eq=False)
class Choice:
    """`c ? a : b`: either value."""

    unit: Unit
    node: Any
    options: tuple[Resolved, ...]


@dataclass(frozen=True)
class LoopRef:
    """A property of the element a module loop declaration stands for, when the array is not known."""

    name: str
    path: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Lit:
    """An array or object literal; its elements are resolved on access."""

    unit: Unit
    node: Any


Resolved = Union[str, int, bool, None, Ref, ParamRef, VarRef, Expr, Choice, Lit, LoopRef]

_CHAIN = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")
_ESCAPES = {"\\\\": "\\", "\\'": "'", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


def unescape(text: str) -> str:
    """The text of a Bicep string literal as pycep returns it, escapes (`\\'`, `\\n`, ...) resolved."""
    return re.sub(r"\\[\\'nrt$]", lambda match: _ESCAPES[match.group(0)], text)


def _only_interpolation(text: str) -> str | None:
    """`x.y` for the string `${x.y}` (a whole string that is one interpolation)."""
    match = _INTERPOLATION.fullmatch(text)
    return match.group(1).strip() if match else None


def _accessor_chain(node: Any) -> tuple[Any, list[str]] | None:
    """`(base, ["b", "c"])` for `base.b.c` (pycep nests property accessors to the right)."""
    operands = node["operator"]["operands"]
    base, rest = operands["operand_1"], operands["operand_2"]
    names: list[str] = []
    while isinstance(rest, dict):
        operator = rest.get("operator") or {}
        if operator.get("type") != "property_accessor" or not isinstance(operator["operands"]["operand_1"], str):
            return None
        names.append(operator["operands"]["operand_1"])
        rest = operator["operands"]["operand_2"]
    if not isinstance(rest, str):
        return None
    names.append(rest)
    return base, names


def _object_item(node: dict[str, Any], key: str) -> Any:
    for candidate in (key, f"'{key}'"):
        if candidate in node:
            return node[candidate]
    raise KeyError(key)


def resolve(unit: Unit, node: Any, path: tuple[str, ...] = ()) -> Resolved:
    """What `node` (written in `unit`), read at `path`, stands for."""
    if isinstance(node, str):
        inner = _only_interpolation(node)
        if inner is not None and _CHAIN.match(inner):
            head, *names = inner.split(".")
            return resolve_symbol(unit, head, (*names, *path))
        if unit.is_symbol(node):
            return resolve_symbol(unit, node, path)
        if path:
            raise ExtractionError(f"{unit.path.name}: cannot read {'.'.join(path)} of the string {node!r}")
        return Expr(unit, node) if "${" in node else unescape(node)
    if isinstance(node, (bool, int)) or node is None:
        if path:
            raise ExtractionError(f"{unit.path.name}: cannot read {'.'.join(path)} of {node!r}")
        return node
    if isinstance(node, list):
        if path:
            return resolve(unit, node[int(path[0])], path[1:])
        return Lit(unit, node)
    if isinstance(node, dict):
        if set(node) == {"loop_item"}:
            return LoopRef(node["loop_item"]["name"], (*node["loop_item"]["path"], *path))
        if set(node) == {"missing"}:
            raise ExtractionError(f"{unit.path.name}: {node['missing']}")
        if "loop_type" in node and set(node) <= {"loop_type", "condition", "config"}:
            return _for_expression(unit, node, path)
        if set(node) == {"literal"}:
            if path:
                raise ExtractionError(f"{unit.path.name}: cannot read {'.'.join(path)} of {node['literal']!r}")
            return str(node["literal"])
        operator = node.get("operator")
        if isinstance(operator, dict):
            if operator["type"] == "property_accessor":
                chain = _accessor_chain(node)
                if chain is not None:
                    base, names = chain
                    return resolve(unit, base, (*names, *path))
            if operator["type"] == "index_accessor":
                index = deref(resolve(unit, operator["operands"]["operand_2"]))
                if isinstance(index, (int, str)) and not isinstance(index, bool):
                    # An array's element, or an object's property by a known key (the drainer's
                    # actions by drain method).
                    return resolve(unit, operator["operands"]["operand_1"], (str(index), *path))
                return Expr(unit, node)
            if operator["type"] == "conditional":
                operands = operator["operands"]
                known = truth(unit, operands["condition"])
                if known is not None:
                    return resolve(unit, operands["true_value" if known else "false_value"], path)
                if path:
                    return Expr(unit, node)
                options = (resolve(unit, operands["true_value"]), resolve(unit, operands["false_value"]))
                return Choice(unit, node, options)
            return Expr(unit, node)
        if "function" in node:
            if node["function"].get("type") == "filter" and not path:
                return _filtered(unit, node)
            return Expr(unit, node)
        if path:
            try:
                return resolve(unit, _object_item(node, path[0]), path[1:])
            except KeyError:
                raise ExtractionError(f"{unit.path.name}: no {'.'.join(path)} in {sorted(node)}") from None
        return Lit(unit, node)
    raise ExtractionError(f"{unit.path.name}: unexpected node {node!r}")


def _for_expression(unit: Unit, node: dict[str, Any], path: tuple[str, ...]) -> Resolved:
    """`[for item in array: value]` or `[for index in range(start, count): value]`: an array of the
    values, each with the variable bound, when the elements are known; else the expression."""
    loop = node["loop_type"]
    items = _loop_items(unit, loop)
    if node.get("condition") is not None or _ANY_ELEMENT in items:
        return Expr(unit, node)
    values = [_bound(node["config"], _loop_variable(unit, loop), item) for item in items]
    if path:
        if not path[0].isdigit() or int(path[0]) >= len(values):
            raise ExtractionError(f"{unit.path.name}: no element {path[0]} in an array of {len(values)}")
        return resolve(unit, values[int(path[0])], path[1:])
    return Lit(unit, values)


def _filtered(unit: Unit, node: dict[str, Any]) -> Resolved:
    """`filter(array, x => condition)`: the elements whose condition holds, when the array and each
    element's condition are known; else the expression."""
    parameters = node["function"]["parameters"]
    array = deref(resolve(unit, parameters["input_array"]))
    if not isinstance(array, Lit) or not isinstance(array.node, list):
        return Expr(unit, node)
    kept = []
    for item in array.node:
        value = known(resolve(array.unit, item))
        if value is _UNKNOWN:
            return Expr(unit, node)
        holds = truth(unit, _bound(parameters["expression"], parameters["input_element"], value))
        if holds is None:
            return Expr(unit, node)
        if holds:
            kept.append(item)
    return Lit(array.unit, kept)


_UNKNOWN = object()


def known(resolved: Resolved) -> Any:
    """The value as a deployment computes it where every part of it is written down (literals,
    assumed parameters, what they select); _UNKNOWN where any part is decided at deployment time."""
    resolved = deref(resolved)
    if isinstance(resolved, (str, int, bool)) or resolved is None:
        return resolved
    if isinstance(resolved, ParamRef):
        return _UNKNOWN
    if isinstance(resolved, Expr) and isinstance(resolved.node, str):
        text = value_of(resolved)
        return _UNKNOWN if "${" in text else text
    if isinstance(resolved, Lit):
        node = resolved.node
        pairs = enumerate(node) if isinstance(node, list) else ((key.strip("'"), item) for key, item in node.items())
        values = {key: known(resolve(resolved.unit, item)) for key, item in pairs}
        if any(value is _UNKNOWN for value in values.values()):
            return _UNKNOWN
        return list(values.values()) if isinstance(node, list) else values
    return _UNKNOWN


def _assumed(unit: Unit, value: Any, path: tuple[str, ...]) -> Resolved:
    for key in path:
        value = value[int(key)] if isinstance(value, list) else value[key]
    if isinstance(value, (list, dict)):
        return Lit(unit, value)
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    raise ExtractionError(f"cannot assume the parameter value {value!r}")


def resolve_symbol(unit: Unit, name: str, path: tuple[str, ...] = ()) -> Resolved:
    parameters = unit.section("parameters")
    if name in parameters:
        if name in unit.arguments:
            assert unit.caller is not None
            return resolve(unit.caller, unit.arguments[name], path)
        if unit.caller is None:
            if name in unit.assumed:
                return _assumed(unit, unit.assumed[name], path)
            return ParamRef(unit, name, path)
        # A module parameter its caller leaves alone: its default is the value.
        if "default" not in parameters[name]:
            raise ExtractionError(f"{unit.path.name}: parameter {name} gets no value from {unit.caller.path.name}")
        return resolve(unit, parameters[name]["default"], path)
    variables = unit.section("variables")
    if name in variables:
        resolved = resolve(unit, variables[name]["value"], path)
        if not path and isinstance(resolved, (Expr, Choice)):
            return VarRef(unit, name)
        return resolved
    resources = unit.section("resources")
    if name in resources:
        if path == ("name",):
            return resolve(unit, split_condition(resources[name]["config"])[1]["name"])
        return Ref(unit, name, path)
    if name in unit.section("modules"):
        if len(path) >= 2 and path[0] == "outputs":
            module = unit.module(name)
            outputs = module.section("outputs")
            if path[1] not in outputs:
                raise ExtractionError(f"{module.path.name} has no output {path[1]}")
            return resolve(module, outputs[path[1]]["value"], path[2:])
        return Ref(unit, name, path)
    raise ExtractionError(f"{unit.path.name}: unknown symbol {name}")


def deref(resolved: Resolved) -> Resolved:
    """A variable's value (expression) instead of the variable."""
    while isinstance(resolved, VarRef):
        resolved = resolve(resolved.unit, resolved.unit.section("variables")[resolved.name]["value"])
    return resolved


def value_of(resolved: Resolved) -> Any:
    """A concrete value: literals as they are, main.bicep's parameters at their default.

    Whatever Azure computes at deployment time (an id, an endpoint, a function of them)
    comes back as its source text.
    """
    if isinstance(resolved, ParamRef):
        parameter = resolved.unit.section("parameters")[resolved.name]
        if "default" not in parameter:
            return None
        return value_of(resolve(resolved.unit, parameter["default"], resolved.path))
    if isinstance(resolved, Lit):
        node = resolved.node
        if isinstance(node, list):
            return [value_of(resolve(resolved.unit, item)) for item in node]
        return {key.strip("'"): value_of(resolve(resolved.unit, item)) for key, item in node.items()}
    if isinstance(resolved, (Ref, VarRef, Expr, Choice, LoopRef)):
        return render(resolved)
    return resolved


def same(a: Resolved, b: Resolved) -> bool:
    """Whether `a` and `b` can be the same value: equal, or equal in one branch of a `?:`."""
    left = a.options if isinstance(a, Choice) else (a,)
    right = b.options if isinstance(b, Choice) else (b,)
    return any(x == y for x in left for y in right)


# --- conditions ----------------------------------------------------------------------------


def truth(unit: Unit, node: Any) -> bool | None:
    """The value of a condition when every deployment gives it the same one; None when it depends."""
    if node is None:
        return True
    resolved = deref(resolve(unit, node))
    if isinstance(resolved, bool):
        return resolved
    if not isinstance(resolved, Expr) or not isinstance(resolved.node, dict):
        return None
    unit, node = resolved.unit, resolved.node
    operator = node.get("operator") or {}
    function = node.get("function") or {}
    operands = operator.get("operands") or {}
    if operator.get("type") == "not":
        value = truth(unit, operands["bool_value"])
        return None if value is None else not value
    if operator.get("type") in ("equals", "not_equals"):
        left, right = (deref(resolve(unit, operand)) for operand in operands.values())
        if all(isinstance(side, (str, int, bool)) for side in (left, right)):
            return (left == right) is (operator["type"] == "equals")
        return None
    if operator.get("type") in ("and", "or"):
        values = [truth(unit, operand) for operand in operands.values()]
        if operator["type"] == "and":
            return False if False in values else (True if all(values) else None)
        return True if True in values else (False if all(value is False for value in values) else None)
    if function.get("type") == "empty":
        tested = deref(resolve(unit, function["parameters"]["item_to_test"]))
        if isinstance(tested, str):
            return tested == ""
        if isinstance(tested, Lit):
            return len(tested.node) == 0
    if function.get("type") == "contains":
        container = known(resolve(unit, function["parameters"]["container"]))
        item = known(resolve(unit, function["parameters"]["item_to_find"]))
        if container is _UNKNOWN or item is _UNKNOWN:
            return None
        if isinstance(container, dict) and isinstance(item, str):
            # An object's keys compare without case (ARM's contains()).
            return item.lower() in {key.lower() for key in container}
        if isinstance(container, (list, str)):
            return item in container
    return None


def deployed(unit: Unit) -> bool:
    """False when the unit's module declaration (or a caller's) is never deployed."""
    while unit.caller is not None:
        if truth(unit.caller, unit.condition) is False:
            return False
        unit = unit.caller
    return True


# --- text ----------------------------------------------------------------------------------


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


_BINARY = {
    "and": "&&",
    "or": "||",
    "equals": "==",
    "not_equals": "!=",
    "add": "+",
    "greater_than": ">",
    "less_than": "<",
    "coalesce": "??",
}


def render_node(unit: Unit, node: Any) -> str:
    """Bicep-like source text of a node."""
    if isinstance(node, bool):
        return "true" if node else "false"
    if node is None:
        return "null"
    if isinstance(node, int):
        return str(node)
    if isinstance(node, str):
        return node if unit.is_symbol(node) else "'" + node + "'"
    if isinstance(node, list):
        return "[" + ", ".join(render_node(unit, item) for item in node) + "]"
    if set(node) == {"loop_item"}:
        return ".".join((node["loop_item"]["name"], *node["loop_item"]["path"]))
    if set(node) == {"literal"}:
        return "'" + str(node["literal"]) + "'"
    operator = node.get("operator")
    if isinstance(operator, dict):
        operands = operator["operands"]
        kind = operator["type"]
        if kind == "property_accessor":
            chain = _accessor_chain(node)
            if chain is not None:
                return ".".join((render_node(unit, chain[0]), *chain[1]))
        if kind == "conditional":
            parts = [render_node(unit, operands[key]) for key in ("condition", "true_value", "false_value")]
            return f"{parts[0]} ? {parts[1]} : {parts[2]}"
        if kind == "not":
            return "!" + render_node(unit, operands["bool_value"])
        if kind in _BINARY:
            return f" {_BINARY[kind]} ".join(render_node(unit, operand) for operand in operands.values())
        return str(kind) + "(" + ", ".join(render_node(unit, operand) for operand in operands.values()) + ")"
    function = node.get("function")
    if isinstance(function, dict):
        arguments = [
            render_node(unit, value) for value in (function.get("parameters") or {}).values() if value is not None
        ]
        text = _camel(function["type"]) + "(" + ", ".join(arguments) + ")"
        if function.get("index") is not None:
            text += f"[{function['index']}]"
        if function.get("property_name"):
            text += "." + function["property_name"]
        return text
    return "{" + ", ".join(f"{key}: {render_node(unit, value)}" for key, value in node.items()) + "}"


def render(resolved: Resolved) -> str:
    """Source text of a value, with references followed to where they are declared."""
    if isinstance(resolved, str):
        return resolved
    if isinstance(resolved, bool):
        return "true" if resolved else "false"
    if isinstance(resolved, int):
        return str(resolved)
    if resolved is None:
        return ""
    if isinstance(resolved, (Ref, ParamRef, LoopRef)):
        name = resolved.symbol if isinstance(resolved, Ref) else resolved.name
        return ".".join((name, *resolved.path))
    if isinstance(resolved, VarRef):
        return render(deref(resolved))
    if isinstance(resolved, Expr) and isinstance(resolved.node, str):
        return _render_template(resolved.unit, resolved.node)
    if isinstance(resolved, (Expr, Choice, Lit)):
        return render_node(resolved.unit, resolved.node)
    raise ExtractionError(f"cannot render {resolved!r}")


def source_text(resolved: Resolved) -> str:
    """A value as it reads in the source: literal text as is, an expression as `${...}`."""
    if isinstance(resolved, str):
        return resolved
    if isinstance(resolved, Expr) and isinstance(resolved.node, str):
        return _render_template(resolved.unit, resolved.node)
    return "${" + render(resolved) + "}"


def _render_template(unit: Unit, text: str) -> str:
    def part(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        if not _CHAIN.match(inner):
            return match.group(0)
        head, *names = inner.split(".")
        resolved = resolve_symbol(unit, head, tuple(names))
        if isinstance(resolved, str):
            return resolved
        if isinstance(resolved, int) and not isinstance(resolved, bool):
            return str(resolved)
        return "${" + render(resolved) + "}"

    return unescape(_INTERPOLATION.sub(part, text))


# --- the deployment ------------------------------------------------------------------------


class ParameterRefused(ExtractionError):
    """A value assumed for a parameter of main.bicep that Azure would refuse before deploying."""


class Deployment:
    """main.bicep and every module it declares, with the arguments of each declaration."""

    def __init__(self, main: Path = MAIN, parameters: Mapping[str, Any] | None = None) -> None:
        """`parameters`: values of main.bicep's parameters to assume, as a deployment would set them;
        ParameterRefused when one is not declared or breaks its parameter's decorators, as Azure would
        refuse it. commandsShards is assumed 1 (one commands entity) unless given: it is how many
        there are."""
        assumed = {"agentPackage": EXAMPLE_AGENT_PACKAGE, "commandsShards": 1, **(parameters or {})}
        self.main = Unit(path=main.resolve(), doc=_parsed(main.resolve()), assumed=assumed)
        for name, value in (parameters or {}).items():
            refused = parameter_refusal(self.main, name, value)
            if refused:
                raise ParameterRefused(refused)
        self.units: list[Unit] = []
        self._function_identity: Ref | None = None
        self._settings: dict[str, Resolved] | None = None
        self._agent_identity: Ref | None = None
        self._collect(self.main)

    def _collect(self, unit: Unit) -> None:
        self.units.append(unit)
        for symbol in unit.section("modules"):
            for module in unit.modules(symbol):
                self._collect(module)

    def resources(self, kind: str, *, existing: bool | None = False) -> list[Resource]:
        """The resources of one type that some deployment creates (or, with existing=None, also references)."""
        found = []
        for unit in self.units:
            if not deployed(unit):
                continue
            for symbol, declaration in unit.section("resources").items():
                if declaration["type"] != kind or (existing is not None and declaration["existing"] != existing):
                    continue
                condition, config = split_condition(declaration["config"])
                if truth(unit, condition) is False:
                    continue
                found.append(Resource(unit, symbol, kind, declaration["existing"], condition, config))
        return found

    def one(self, kind: str) -> Resource:
        found = self.resources(kind)
        if len(found) != 1:
            raise ExtractionError(f"expected one {kind}, found {[r.symbol for r in found]}")
        return found[0]

    def named(self, kind: str, name: Any) -> Resource:
        found = [resource for resource in self.resources(kind) if resource.name == name]
        if len(found) != 1:
            raise ExtractionError(f"expected one {kind} named {name!r}, found {[r.symbol for r in found]}")
        return found[0]

    def resource_of(self, ref: Resolved) -> Resource:
        """The resource a reference (`x`, `x.id`) points at."""
        if not isinstance(ref, Ref):
            raise ExtractionError(f"not a resource reference: {render(ref)}")
        declaration = ref.unit.section("resources").get(ref.symbol)
        if declaration is None:
            raise ExtractionError(f"{ref.unit.path.name}: {ref.symbol} is not a resource")
        condition, config = split_condition(declaration["config"])
        return Resource(ref.unit, ref.symbol, declaration["type"], declaration["existing"], condition, config)

    # the function app

    @property
    def site(self) -> Resource:
        return self.one(SITE)

    def app_settings(self) -> dict[str, Resolved]:
        """The site's app settings, name -> value (a setting added under a condition included)."""
        settings: dict[str, Resolved] = {}
        for unit, entry in self._setting_entries(self.site.get("properties", "siteConfig", "appSettings")):
            name = value_of(resolve(unit, entry["name"]))
            if name in settings:
                raise ExtractionError(f"app setting {name} is set twice")
            settings[name] = resolve(unit, entry["value"])
        return settings

    def _setting_entries(self, resolved: Resolved) -> Iterator[tuple[Unit, dict[str, Any]]]:
        resolved = deref(resolved)
        if isinstance(resolved, Lit) and isinstance(resolved.node, list):
            for item in resolved.node:
                if isinstance(item, dict) and "name" in item:
                    yield resolved.unit, item
                else:
                    yield from self._setting_entries(resolve(resolved.unit, item))
        elif isinstance(resolved, Choice):
            for option in resolved.options:
                yield from self._setting_entries(option)
        elif isinstance(resolved, Expr) and isinstance(resolved.node, dict) and "function" in resolved.node:
            function = resolved.node["function"]
            if function["type"] not in ("concat", "union"):
                raise ExtractionError(f"app settings built with {function['type']}(): cannot read them")
            for argument in function["parameters"].values():
                yield from self._setting_entries(resolve(resolved.unit, argument))
        else:
            raise ExtractionError(f"cannot read app settings from {render(resolved)}")

    def function_identity(self) -> Ref:
        """The identity the function app runs as."""
        if self._function_identity is None:
            self._function_identity = self.identity_of(self.site)
        return self._function_identity

    def agent_identity(self) -> Ref:
        """The identity main.bicep hands out as `agentIdentityId` for the agents' VMs."""
        if self._agent_identity is not None:
            return self._agent_identity
        outputs = self.main.section("outputs")
        if "agentIdentityId" not in outputs:
            raise ExtractionError("main.bicep has no output agentIdentityId")
        ref = resolve(self.main, outputs["agentIdentityId"]["value"])
        if not isinstance(ref, Ref):
            raise ExtractionError(f"agentIdentityId is not an identity's id: {render(ref)}")
        self._agent_identity = Ref(ref.unit, ref.symbol)
        return self._agent_identity

    def identity_of(self, resource: Resource) -> Ref:
        """The user-assigned identity a resource runs as."""
        identities = resource.config.get("identity", {}).get("userAssignedIdentities") or {}
        if len(identities) != 1:
            raise ExtractionError(f"{resource.symbol}: expected one user-assigned identity, found {len(identities)}")
        key = next(iter(identities)).strip("'")
        ref = resolve(resource.unit, key)
        if not isinstance(ref, Ref):
            raise ExtractionError(f"{resource.symbol}: identity {key} is not a resource id")
        return Ref(ref.unit, ref.symbol)

    # role assignments

    def role_of(self, assignment: Resource) -> str:
        definition = deref(assignment.get("properties", "roleDefinitionId"))
        role_name = subscription_role_name(definition)
        if role_name is not None:
            custom = self.custom_role_named(definition.unit, role_name) if isinstance(definition, Expr) else None
            if custom is not None:
                return str(custom.value("properties", "roleName"))
            role_id = value_of(resolve(definition.unit, role_name)) if isinstance(definition, Expr) else None
            return BUILT_IN_ROLES.get(str(role_id).lower(), f"unknown role {role_id}")
        if isinstance(definition, Ref) and definition.path == ("id",):
            role = self.resource_of(definition)
            if role.type == ROLE_DEFINITION:
                if role.existing:
                    return BUILT_IN_ROLES.get(str(role.name).lower(), f"unknown role {role.name}")
                return str(role.value("properties", "roleName"))
        raise ExtractionError(f"{assignment.symbol}: cannot tell the role of {render(definition)}")

    def custom_role_named(self, unit: Unit, node: Any) -> Resource | None:
        """The role definition this deployment creates whose `name` the node reads (`drainerRole.name`)."""
        if not isinstance(node, dict) or (node.get("operator") or {}).get("type") != "property_accessor":
            return None
        chain = _accessor_chain(node)
        if chain is None or chain[1] != ["name"] or not isinstance(chain[0], str):
            return None
        declaration = unit.section("resources").get(chain[0])
        if declaration is None or declaration["type"] != ROLE_DEFINITION or declaration["existing"]:
            return None
        return self.resource_of(Ref(unit, chain[0]))

    def principal_of(self, assignment: Resource) -> str:
        principal = assignment.get("properties", "principalId")
        if isinstance(principal, Ref):
            identity = Ref(principal.unit, principal.symbol)
            if identity == self.function_identity():
                return FUNCTION
            if identity == self.agent_identity():
                return AGENT
            if principal.path == ("identity", "principalId") and self.resource_of(identity).type == SYSTEM_TOPIC_TYPE:
                return SYSTEM_TOPIC
        if isinstance(principal, (str, LoopRef)):
            # A principal id the deployment is given (one VM's own identity, commandsSubscriptionVms).
            return vm_principal(render(principal))
        return f"unknown principal {render(principal)}"

    def resource_group_of(self, unit: Unit) -> Resolved:
        """The name of the resource group a unit deploys into; None for the deployment's own."""
        while unit.caller is not None:
            if unit.scope is not None:
                scope = resolve(unit.caller, unit.scope)
                if not isinstance(scope, Expr) or not isinstance(scope.node, dict):
                    raise ExtractionError(f"{unit.path.name}: cannot read the scope {render(scope)}")
                function = scope.node.get("function") or {}
                if function.get("type") != "resource_group":
                    raise ExtractionError(f"{unit.path.name}: deployed at {render(scope)}, not a resource group")
                name = function["parameters"].get("resource_group_name")
                return None if name is None else resolve(unit.caller, name)
            unit = unit.caller
        return None

    def assignments(self) -> list[Resource]:
        return self.resources(ROLE_ASSIGNMENT)

    # the entities, as the function app's settings name them

    @property
    def settings(self) -> dict[str, Resolved]:
        if self._settings is None:
            self._settings = self.app_settings()
        return self._settings

    def _setting(self, name: str) -> Resolved:
        if name not in self.settings:
            raise ExtractionError(f"the function app has no setting {name}")
        return self.settings[name]

    def events_topic(self) -> Resource:
        return self.named(TOPIC, value_of(self._setting("MBRIDGE_EVENTS_TOPIC")))

    def function_subscription(self) -> Resource:
        return self.named(SUBSCRIPTION, value_of(self._setting("MBRIDGE_EVENTS_SUBSCRIPTION")))

    def operator_results(self) -> tuple[Resource, Resource]:
        """The subscription whose rule filters with SQL, and that rule."""
        filtered = [
            (self.resource_of(rule.get("parent")), rule)
            for rule in self.resources(RULE)
            if rule.value("properties", "filterType") == "SqlFilter"
        ]
        if len(filtered) != 1:
            raise ExtractionError(f"expected one subscription with a SQL filter, found {len(filtered)}")
        return filtered[0]

    def commands_queue(self) -> Resource:
        return self.named(QUEUE, value_of(self._setting("MBRIDGE_COMMANDS_QUEUE")))

    def central_queue(self) -> Resource:
        """The queue MBRIDGE_CENTRAL_QUEUE names when the control plane's path is deployed (the
        setting is empty without it)."""
        setting = self._setting("MBRIDGE_CENTRAL_QUEUE")
        options = setting.options if isinstance(setting, Choice) else (setting,)
        names = {value_of(option) for option in options} - {""}
        if len(names) != 1:
            raise ExtractionError(f"MBRIDGE_CENTRAL_QUEUE names no one queue: {render(setting)}")
        return self.named(QUEUE, names.pop())

    def commands_topic(self) -> Resource:
        """The topic of the isolated mode (commandsMode = 'topic')."""
        return self.named(TOPIC, value_of(self._setting("MBRIDGE_COMMANDS_TOPIC")))

    def commands_entities(self) -> dict[int, Resource]:
        """shard -> the commands queue (the topic in the topic mode) of that shard: shard 0 is the
        one the function app's setting names (MBRIDGE_COMMANDS_QUEUE, MBRIDGE_COMMANDS_TOPIC), shard
        k the queue (topic) of that name with `-<k>` (wire/shards.py)."""
        via_topic = value_of(self._setting("MBRIDGE_COMMANDS_MODE")) == "topic"
        kind = TOPIC if via_topic else QUEUE
        base = str(value_of(self._setting("MBRIDGE_COMMANDS_TOPIC" if via_topic else "MBRIDGE_COMMANDS_QUEUE")))
        pattern = re.compile(re.escape(base) + r"(?:-([1-9][0-9]*))?")
        found: dict[int, Resource] = {}
        for resource in self.resources(kind):
            match = pattern.fullmatch(str(resource.name))
            if match:
                shard = int(match.group(1) or 0)
                if shard in found:
                    raise ExtractionError(f"two commands entities of shard {shard}: {resource.name}")
                found[shard] = resource
        return dict(sorted(found.items()))

    def commands_subscriptions(self) -> list[Resource]:
        """The per-VM subscriptions of the commands topics (modules/vm-commands-subscription.bicep)."""
        topics = {resource.name for resource in self.commands_entities().values() if resource.type == TOPIC}
        found = []
        for subscription in self.resources(SUBSCRIPTION):
            parent = self.resource_of(subscription.get("parent"))
            if parent.type == TOPIC and parent.name in topics:
                found.append(subscription)
        return found

    def state_table(self) -> Resource:
        return self.named(TABLE, value_of(self._setting("MBRIDGE_STATE_TABLE")))

    def audit_table(self) -> Resource:
        return self.named(TABLE, value_of(self._setting("MBRIDGE_AUDIT_TABLE")))

    def storage_account(self) -> Resource:
        return self.one(STORAGE_ACCOUNT)

    def trust_resource_groups_array(self) -> Resolved | None:
        """The array MBRIDGE_TRUST_RESOURCE_GROUPS is written from: `join(<array>, ',')`."""
        return self.joined_array("MBRIDGE_TRUST_RESOURCE_GROUPS")

    def joined_array(self, name: str) -> Resolved | None:
        """The array an app setting is written from: `join(<array>, ',')`; None for anything else."""
        setting = deref(self.settings.get(name))
        if not isinstance(setting, Expr) or not isinstance(setting.node, dict):
            return None
        function = setting.node.get("function") or {}
        parameters = function.get("parameters") or {}
        if function.get("type") != "join" or value_of(resolve(setting.unit, parameters.get("delimiter"))) != ",":
            return None
        return resolve(setting.unit, parameters["input_array"])

    def _per_trust_resource_group(self, unit: Unit) -> bool:
        """Whether `unit` is a module declared once per element of the array the trust resource
        groups setting is written from, each deployed into the resource group its element names
        (`scope: resourceGroup(<element>)`, in this subscription)."""
        array = self.trust_resource_groups_array()
        caller = unit.caller
        if array is None or caller is None or unit.loop_array is None:
            return False
        declared = unit.declared_scope if isinstance(unit.declared_scope, dict) else {}
        function = declared.get("function") or {}
        parameters = function.get("parameters") or {}
        if function.get("type") != "resource_group" or parameters.get("subscription_id") is not None:
            return False
        if parameters.get("resource_group_name") != unit.loop_item:
            return False
        return _same_value(resolve(caller, unit.loop_array), array)

    def scope_of(self, assignment: Resource) -> str:
        """The SCOPE_* name of what a role assignment grants on."""
        if "scope" not in assignment.config:
            if self._per_trust_resource_group(assignment.unit):
                return SCOPE_VM_RESOURCE_GROUPS
            group = self.resource_group_of(assignment.unit)
            nic_group = self.settings.get("MBRIDGE_LB_NIC_RESOURCE_GROUP")
            if group is not None and nic_group is not None and same(group, nic_group):
                return SCOPE_NIC_RESOURCE_GROUP
            return f"resource group {render(group) if group is not None else '(the deployment)'}"
        target = self.resource_of(resolve(assignment.unit, assignment.config["scope"]))
        by_name = {
            (kind, name): scope
            for kind, lookup, scope in (
                (TOPIC, self.events_topic, SCOPE_EVENTS_TOPIC),
                (SUBSCRIPTION, self.function_subscription, SCOPE_FUNCTION_SUBSCRIPTION),
                (TABLE, self.state_table, SCOPE_STATE_TABLE),
                (TABLE, self.audit_table, SCOPE_AUDIT_TABLE),
                (STORAGE_ACCOUNT, self.storage_account, SCOPE_STORAGE_ACCOUNT),
                (QUEUE, self.central_queue, SCOPE_CENTRAL_QUEUE),
            )
            for name in _names_of(lookup)
        }
        # The commands entities this deployment has (queues or topics, by the commands mode), by shard.
        shards = {(entity.type, entity.name): shard for shard, entity in self.commands_entities().items()}
        if (target.type, target.name) in by_name:
            return by_name[(target.type, target.name)]
        if (target.type, target.name) in shards:
            base = SCOPE_COMMANDS_TOPIC if target.type == TOPIC else SCOPE_COMMANDS_QUEUE
            return commands_entity_scope(base, shards[(target.type, target.name)])
        if target.type == SUBSCRIPTION:
            parent = self.resource_of(target.get("parent"))
            if (TOPIC, parent.name) in shards:
                return commands_subscription_scope(str(target.name), shards[(TOPIC, parent.name)])
        if target.type == APP_INSIGHTS:
            return SCOPE_APP_INSIGHTS
        if target.type == KEY_VAULT_SECRET:
            return SCOPE_SIGNING_SECRET
        drained = self.settings.get("MBRIDGE_LB_NAME")
        if target.type == LOAD_BALANCER and drained is not None and same(target.get("name"), drained):
            return SCOPE_LOAD_BALANCER
        if target.type == VIRTUAL_NETWORK:
            return SCOPE_VIRTUAL_NETWORK
        return f"{target.type} {target.name}"

    def grants(self) -> list[RoleGrant]:
        return [
            RoleGrant(self.principal_of(assignment), self.role_of(assignment), self.scope_of(assignment))
            for assignment in self.assignments()
        ]


def subscription_role_name(definition: Resolved) -> Any:
    """The name argument (as written) of `subscriptionResourceId('Microsoft.Authorization/roleDefinitions', <name>)`:
    a role definition id in the subscription-level form, in the deployment's own subscription. None for any
    other form (a resource-group-scoped `x.id`, a literal id, another subscription's)."""
    definition = deref(definition)
    if not isinstance(definition, Expr) or not isinstance(definition.node, dict):
        return None
    function = definition.node.get("function") or {}
    parameters = function.get("parameters") or {}
    if function.get("type") != "subscription_resource_id" or parameters.get("resource_type") != ROLE_DEFINITION:
        return None
    if parameters.get("subscription_id") is not None or parameters.get("resource_name_2") is not None:
        return None
    return parameters["resource_name_1"]


def _same_value(a: Resolved, b: Resolved) -> bool:
    """Equal references, or the same literal node (literals compare by identity)."""
    if isinstance(a, (Lit, Expr)) and isinstance(b, (Lit, Expr)):
        return type(a) is type(b) and a.unit is b.unit and a.node is b.node
    return a == b


def _names_of(lookup: Any) -> list[Any]:
    """[the name of the resource `lookup()` finds], or [] when this deployment has none."""
    try:
        return [lookup().name]
    except ExtractionError:
        return []


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


_RESOURCE_GROUP_ID = re.compile(r"^\$\{subscription\(\)\.id\}/resourceGroups/\$\{[A-Za-z_]\w*\}$")


def is_resource_group_id(resolved: Resolved) -> bool:
    """`resourceGroup().id` or `'${subscription().id}/resourceGroups/${name}'` (possibly lowered)."""
    resolved = deref(resolved)
    if not isinstance(resolved, Expr):
        return False
    node = resolved.node
    if isinstance(node, str):
        return bool(_RESOURCE_GROUP_ID.match(node))
    function = node.get("function") or {}
    if function.get("type") == "to_lower":
        return is_resource_group_id(resolve(resolved.unit, function["parameters"]["string_to_change"]))
    parameters = function.get("parameters") or {}
    return (
        function.get("type") == "resource_group"
        and function.get("property_name") == "id"
        and not any(parameters.values())
    )


def array_items(resolved: Resolved) -> list[Resolved]:
    """The elements of an array built with literals, variables, union() and concat()."""
    resolved = deref(resolved)
    if isinstance(resolved, Lit) and isinstance(resolved.node, list):
        return [resolve(resolved.unit, item) for item in resolved.node]
    if isinstance(resolved, Expr) and isinstance(resolved.node, dict):
        function = resolved.node.get("function") or {}
        if function.get("type") in ("union", "concat"):
            return [
                item
                for argument in function["parameters"].values()
                for item in array_items(resolve(resolved.unit, argument))
            ]
    raise ExtractionError(f"cannot list the elements of {render(resolved)}")


# --- the scale set -------------------------------------------------------------------------


@dataclass(frozen=True)
class CustomData:
    """How the scale set's custom data is built: base64 of a file with placeholders replaced."""

    template: Path | None  # the file loadTextContent() reads
    replacements: dict[str, Resolved]  # placeholder (as written, quotes included) -> replacement


def custom_data(scale_set: Resource) -> CustomData | None:
    """None unless the custom data is base64(replace(...replace(loadTextContent(file)...)))."""
    outer = deref(scale_set.get("properties", "virtualMachineProfile", "osProfile", "customData"))
    arguments = _call_arguments(outer, "base64")
    if arguments is None:
        return None
    assert isinstance(outer, Expr)
    current = deref(resolve(outer.unit, arguments["input_string"]))
    replacements: dict[str, Resolved] = {}
    while isinstance(current, Expr) and isinstance(current.node, dict):
        function = current.node.get("function") or {}
        parameters = function.get("parameters") or {}
        if function.get("type") == "replace":
            old = value_of(resolve(current.unit, parameters["old_string"]))
            replacements[str(old)] = resolve(current.unit, parameters["new_string"])
            current = deref(resolve(current.unit, parameters["original_string"]))
            continue
        if function.get("type") == "load_text_content":
            path = (current.unit.path.parent / str(parameters["file_path"])).resolve()
            return CustomData(template=path, replacements=replacements)
        break
    return CustomData(template=None, replacements=replacements)


def _health_probe(deployment: Deployment, scale_set: Resource) -> tuple[str, int]:
    """(request path, port) of the load balancer probe the scale set's health probe points at."""
    probe = scale_set.get("properties", "virtualMachineProfile", "networkProfile", "healthProbe", "id")
    if not isinstance(probe, Expr) or not isinstance(probe.node, str):
        raise ExtractionError(f"health probe id is not '${{loadBalancer.id}}/probes/<name>': {render(probe)}")
    match = re.fullmatch(r"\$\{(\w+)\.id\}/probes/(.+)", probe.node)
    if not match:
        raise ExtractionError(f"health probe id is not '${{loadBalancer.id}}/probes/<name>': {probe.node}")
    load_balancer = deployment.resource_of(Ref(probe.unit, match.group(1)))
    probe_name = value_of(resolve(probe.unit, match.group(2)))
    probes = load_balancer.get("properties", "probes")
    if not isinstance(probes, Lit):
        raise ExtractionError(f"{load_balancer.symbol}: probes are not a list")
    for item in probes.node:
        if value_of(resolve(load_balancer.unit, item["name"])) == probe_name:
            path = value_of(resolve(load_balancer.unit, item, ("properties", "requestPath")))
            port = value_of(resolve(load_balancer.unit, item, ("properties", "port")))
            return str(path), int(port)
    raise ExtractionError(f"{load_balancer.symbol} has no probe {probe_name}")


def _decorator(unit: Unit, parameter: str, kind: str) -> Any:
    for decorator in unit.section("parameters")[parameter].get("decorators") or []:
        if decorator["type"] == kind:
            return decorator["argument"]
    return None


def parameter_refusal(unit: Unit, name: str, value: Any) -> str:
    """Why Azure refuses `value` for the parameter `name` of `unit` before deploying anything, in
    the words of its InvalidTemplate error; "" when the parameter's decorators take it."""
    parameters = unit.section("parameters")
    if name not in parameters:
        return f"The template parameter '{name}' is not found."
    invalid = f"The provided value for the template parameter '{name}' is not valid."
    for decorator in parameters[name].get("decorators") or []:
        kind, argument = decorator["type"], decorator.get("argument")
        if kind == "allowed" and value not in argument:
            allowed = ",".join(str(item) for item in argument)
            return f"{invalid} The value '{value}' is not part of the allowed value(s): '{allowed}'."
        if kind == "min_length" and len(value) < argument:
            return f"{invalid} Length of the value should be greater than or equal to '{argument}'."
        if kind == "max_length" and len(value) > argument:
            return f"{invalid} Length of the value should be less than or equal to '{argument}'."
        if kind == "min_value" and value < argument:
            return f"{invalid} Value should be greater than or equal to '{argument}'."
        if kind == "max_value" and value > argument:
            return f"{invalid} Value should be less than or equal to '{argument}'."
    return ""


# --- the facts -----------------------------------------------------------------------------


def read() -> AzureFacts:
    """The facts of infra/azure/main.bicep in the queue mode (the default commandsMode), every
    other parameter left to whoever deploys it."""
    return facts_of(Deployment(parameters={"commandsMode": "queue"}))


def read_isolated(vms: Mapping[str, str]) -> IsolatedCommandsFacts:
    """The facts of main.bicep in the topic mode, with commands subscriptions for `vms` (name ->
    principal id of the VM's own identity), every other parameter left to whoever deploys it."""
    parameters = {
        "commandsMode": "topic",
        "commandsSubscriptionVms": [{"name": name, "principalId": principal} for name, principal in vms.items()],
    }
    return isolated_facts_of(Deployment(parameters=parameters))


def isolated_facts_of(deployment: Deployment) -> IsolatedCommandsFacts:
    topic = deployment.commands_topic()
    return IsolatedCommandsFacts(
        commands_topic=str(topic.name),
        commands_topic_duplicate_detection=topic.value("properties", "requiresDuplicateDetection") is True,
        commands_topic_duplicate_window=str(topic.value("properties", "duplicateDetectionHistoryTimeWindow")),
        commands_topic_ttl=str(topic.value("properties", "defaultMessageTimeToLive")),
        commands_topic_partitioned=topic.value_or_none("properties", "enablePartitioning") is True,
        # Any queue but the control plane's (central-reports.bicep), which both modes have.
        commands_queue_deployed=bool(
            [queue for queue in deployment.resources(QUEUE) if queue.name not in _names_of(deployment.central_queue)]
        ),
        example_scale_set_deployed=bool(deployment.resources(SCALE_SET)),
        function_app_settings={name: source_text(value) for name, value in deployment.settings.items()},
        grants=frozenset(deployment.grants()),
        subscriptions=tuple(
            sorted((vm_subscription(deployment, s) for s in deployment.commands_subscriptions()), key=lambda s: s.name)
        ),
    )


def vm_subscription(deployment: Deployment, subscription: Resource) -> VmCommandsSubscription:
    """One per-VM subscription: its own settings, and the rules declared on it."""
    filters = set()
    default_replaced = False
    for rule in deployment.resources(RULE):
        parent = deployment.resource_of(rule.get("parent"))
        if (parent.unit, parent.symbol) != (subscription.unit, subscription.symbol):
            continue
        default_replaced = default_replaced or rule.name == "$Default"
        kind = rule.value("properties", "filterType")
        if kind == "CorrelationFilter":
            properties = rule.value("properties", "correlationFilter", "properties")
            filters.add(" AND ".join(f"{key} = '{value}'" for key, value in properties.items()))
        else:
            filters.add(str(rule.value("properties", "sqlFilter", "sqlExpression")))
    parent = deployment.resource_of(subscription.get("parent"))
    return VmCommandsSubscription(
        name=str(subscription.name),
        topic=str(parent.name),
        filters=frozenset(filters),
        # A rule written under the name `$Default` replaces the TrueFilter a new subscription gets.
        default_rule_kept=not default_replaced,
        requires_session=subscription.value_or_none("properties", "requiresSession") is True,
        lock=str(subscription.value("properties", "lockDuration")),
        ttl=str(subscription.value("properties", "defaultMessageTimeToLive")),
        max_delivery_count=int(subscription.value("properties", "maxDeliveryCount")),
    )


def _is_literal(unit: Unit, node: Any) -> bool:
    """A value written out in full: no expression, no reference, no interpolation."""
    if isinstance(node, (bool, int)) or node is None:
        return True
    if isinstance(node, str):
        return "${" not in node and not unit.is_symbol(node)
    if isinstance(node, list):
        return all(_is_literal(unit, item) for item in node)
    if isinstance(node, dict):
        return not {"operator", "function", "loop_item", "literal"} & node.keys() and all(
            _is_literal(unit, item) for item in node.values()
        )
    return False


def joined_setting_default(deployment: Deployment, name: str) -> tuple[str, ...]:
    """What a `join(<array>, ',')` setting names when main.bicep's parameters keep their defaults
    (the ones the deployment assumes aside): DEPLOYMENT_RESOURCE_GROUP for `resourceGroup().name`,
    DEPLOYMENT_SUBSCRIPTION for `subscription().subscriptionId`."""
    main = deployment.main
    defaults = {
        name: parameter["default"]
        for name, parameter in main.section("parameters").items()
        if "default" in parameter and _is_literal(main, parameter["default"])
    }
    at_defaults = Deployment(main.path, parameters={**defaults, **main.assumed})
    array = at_defaults.joined_array(name)
    if array is None:
        raise ExtractionError(f"{name} is not join(<array>, ',')")
    own = {"resourceGroup().name": DEPLOYMENT_RESOURCE_GROUP, "subscription().subscriptionId": DEPLOYMENT_SUBSCRIPTION}
    return tuple(own.get(render(item), str(value_of(item))) for item in array_items(array))


# main.bicep's variable of the Service Bus quota problems (its check is not evaluated here).
COMMANDS_QUOTA_PROBLEMS = "commandsQuotaProblems"


def refusal(deployment: Deployment) -> str:
    """Why the deployment is refused: the outcome given to a deployed modules/check.bicep (a file of
    that name) that its @allowed list refuses; "" when every check passes. A check whose outcome depends on what is not
    assumed is an error: the caller must assume the parameters it reads."""
    for unit in deployment.units:
        if unit.path.name != CHECK.name or not deployed(unit):
            continue
        allowed = _decorator(unit, "outcome", "allowed") or []
        outcome = _joined(deref(resolve_symbol(unit, "outcome")))
        if not isinstance(outcome, str) and COMMANDS_QUOTA_PROBLEMS in render(outcome):
            # The quota check computes with integers and filter(), which this reader does not
            # evaluate: it is left out here, and its messages are checked as text (test_bicep.py).
            continue
        if not isinstance(outcome, str):
            raise ExtractionError(f"the outcome of a check depends on more than is assumed: {render(outcome)}")
        if outcome not in allowed:
            return outcome
    return ""


def _call_arguments(resolved: Resolved, kind: str) -> dict[str, Any] | None:
    """The arguments (pycep's parameters, as written) of an expression that is one call of `kind`
    (pycep's snake_case name); None for anything else."""
    if not isinstance(resolved, Expr) or not isinstance(resolved.node, dict):
        return None
    function = resolved.node.get("function") or {}
    if function.get("type") != kind:
        return None
    arguments: dict[str, Any] = function["parameters"]
    return arguments


def _joined(resolved: Resolved) -> Resolved:
    """`join(array, delimiter)` as its text when every element is known text; else as it is."""
    arguments = _call_arguments(resolved, "join")
    if arguments is None:
        return resolved
    assert isinstance(resolved, Expr)
    items = known(resolve(resolved.unit, arguments["input_array"]))
    delimiter = known(resolve(resolved.unit, arguments["delimiter"]))
    if not isinstance(items, list) or not isinstance(delimiter, str) or not all(isinstance(i, str) for i in items):
        return resolved
    return delimiter.join(items)


def drainer_actions(deployment: Deployment, method: str) -> frozenset[str]:
    """The drainer role's actions of the deployment with a drain load balancer drained by `method`."""
    parameters = {
        **deployment.main.assumed,
        "drainLoadBalancerName": DRAIN_LOAD_BALANCER,
        "drainVirtualNetworkName": DRAIN_VIRTUAL_NETWORK,
        "drainMethod": method,
    }
    drainer = Deployment(deployment.main.path, parameters=parameters).resources(ROLE_DEFINITION)[0]
    return frozenset(
        str(action)
        for permission in value_of(drainer.get("properties", "permissions"))
        for action in permission.get("actions") or []
    )


def drain_refusal(deployment: Deployment, virtual_network: str) -> str:
    """`refusal` of the deployment with a drain load balancer and the given virtual network name."""
    parameters = {
        **deployment.main.assumed,
        "drainLoadBalancerName": DRAIN_LOAD_BALANCER,
        "drainVirtualNetworkName": virtual_network,
    }
    return refusal(Deployment(deployment.main.path, parameters=parameters))


def telemetry(deployment: Deployment) -> dict[str, Any]:
    """The AzureFacts.telemetry_* facts: the parameter of main.bicep MBRIDGE_TELEMETRY is set from,
    its @allowed values and default, the setting and grants with each value, Azure's refusal of another."""
    switch = deployment.settings.get(TELEMETRY_SETTING)
    if not isinstance(switch, ParamRef) or switch.unit is not deployment.main:
        raise ExtractionError(f"{TELEMETRY_SETTING} is not set from a parameter of main.bicep: {switch!r}")
    allowed = tuple(str(value) for value in _decorator(deployment.main, switch.name, "allowed") or ())
    setting, grants = {}, {}
    for value in allowed:
        chosen = Deployment(deployment.main.path, parameters={**deployment.main.assumed, switch.name: value})
        setting[value] = source_text(chosen.settings[TELEMETRY_SETTING])
        grants[value] = frozenset(chosen.grants())
    return {
        "telemetry_switch": switch.name,
        "telemetry_allowed": allowed,
        "telemetry_default": str(value_of(switch)),
        "telemetry_setting": setting,
        "telemetry_grants": grants,
        "telemetry_refusal": parameter_refusal(deployment.main, switch.name, TELEMETRY_REFUSED),
    }


def facts_of(deployment: Deployment) -> AzureFacts:
    settings = deployment.settings
    namespace = deployment.one(NAMESPACE)
    topic = deployment.events_topic()
    function_subscription = deployment.function_subscription()
    operator_results, results_rule = deployment.operator_results()
    queue = deployment.commands_queue()

    site = deployment.site
    plan = deployment.resource_of(site.get("properties", "serverFarmId"))
    if plan.type != PLAN:
        raise ExtractionError(f"the site's serverFarmId is a {plan.type}, not a {PLAN}")
    runtime = ("properties", "functionAppConfig", "runtime")
    identity_type = str(site.value("identity", "type"))
    storage = deployment.storage_account()

    grants = frozenset(deployment.grants())

    custom_roles = deployment.resources(ROLE_DEFINITION)
    if len(custom_roles) != 1:
        raise ExtractionError(f"expected one custom role definition, found {len(custom_roles)}")
    drainer = custom_roles[0]
    actions = {method: drainer_actions(deployment, method) for method in DRAIN_METHODS}
    assignable = array_items(drainer.get("properties", "assignableScopes"))

    scale_set = deployment.one(SCALE_SET)
    profile = ("properties", "virtualMachineProfile")
    terminate = (*profile, "scheduledEventsProfile", "terminateNotificationProfile")
    not_before = scale_set.get(*terminate, "notBeforeTimeout")
    if isinstance(not_before, ParamRef):
        not_before_parameter = not_before.name
        allowed = tuple(_decorator(not_before.unit, not_before.name, "allowed") or ())
        not_before_default = str(value_of(not_before))
    else:
        not_before_parameter, allowed, not_before_default = "", (), str(value_of(not_before))
    built = custom_data(scale_set)
    probe_path, probe_port = _health_probe(deployment, scale_set)
    event_grid = (
        "properties",
        "scheduledEventsPolicy",
        "scheduledEventsAdditionalPublishingTargets",
        "eventGridAndResourceGraph",
    )

    central_queue = deployment.central_queue()
    system_topic = deployment.one(SYSTEM_TOPIC_TYPE)
    event_subscription = deployment.one(EVENT_SUBSCRIPTION)
    delivery = ("properties", "deliveryWithResourceIdentity")
    # The module declaration's condition, written in main.bicep: the parameter that switches the path.
    switch = resolve(system_topic.unit.caller, system_topic.unit.condition) if system_topic.unit.caller else None
    central_switch = switch.name if isinstance(switch, ParamRef) else f"no switch parameter: {switch!r}"

    return AzureFacts(
        servicebus_sku=str(namespace.value("sku", "name")),
        servicebus_local_auth_disabled=namespace.value("properties", "disableLocalAuth") is True,
        servicebus_min_tls=str(namespace.value("properties", "minimumTlsVersion")),
        events_topic=str(topic.name),
        events_duplicate_detection=topic.value("properties", "requiresDuplicateDetection") is True,
        events_duplicate_window=str(topic.value("properties", "duplicateDetectionHistoryTimeWindow")),
        function_subscription=str(function_subscription.name),
        function_subscription_max_delivery_count=int(function_subscription.value("properties", "maxDeliveryCount")),
        function_subscription_dead_letter_on_expiration=(
            function_subscription.value("properties", "deadLetteringOnMessageExpiration") is True
        ),
        function_subscription_lock=str(function_subscription.value("properties", "lockDuration")),
        operator_results_subscription=str(operator_results.name),
        operator_results_filter=str(results_rule.value("properties", "sqlFilter", "sqlExpression")),
        commands_queue=str(queue.name),
        commands_requires_session=queue.value("properties", "requiresSession") is True,
        commands_lock=str(queue.value("properties", "lockDuration")),
        commands_ttl=str(queue.value("properties", "defaultMessageTimeToLive")),
        commands_duplicate_detection=queue.value("properties", "requiresDuplicateDetection") is True,
        commands_max_delivery_count=int(queue.value("properties", "maxDeliveryCount")),
        central_queue=str(central_queue.name),
        central_queue_max_delivery_count=int(central_queue.value("properties", "maxDeliveryCount")),
        central_queue_dead_letter_on_expiration=(
            central_queue.value("properties", "deadLetteringOnMessageExpiration") is True
        ),
        central_system_topic_type=str(system_topic.value("properties", "topicType")),
        central_system_topic_location=str(system_topic.value("location")),
        central_system_topic_source_is_subscription=render(system_topic.get("properties", "source"))
        == "subscription().id",
        central_event_types=tuple(
            str(item) for item in value_of(event_subscription.get("properties", "filter", "includedEventTypes"))
        ),
        central_delivery_schema=str(event_subscription.value("properties", "eventDeliverySchema")),
        central_delivery_with_system_identity=(
            event_subscription.value(*delivery, "identity", "type") == "SystemAssigned"
            and deployment.resource_of(event_subscription.get("parent")) == system_topic
            and event_subscription.value(*delivery, "destination", "endpointType") == "ServiceBusQueue"
            and deployment.resource_of(event_subscription.get(*delivery, "destination", "properties", "resourceId"))
            == central_queue
        ),
        central_switch=central_switch,
        central_switch_default=isinstance(switch, ParamRef) and value_of(switch) is True,
        function_plan_sku=str(plan.value("sku", "name")),
        function_linux=plan.value("properties", "reserved") is True and "linux" in str(site.value("kind")).split(","),
        function_runtime=str(site.value(*runtime, "name")),
        function_runtime_version=str(site.value(*runtime, "version")),
        function_user_assigned_identity="UserAssigned" in identity_type.split(",")
        and isinstance(deployment.function_identity(), Ref),
        function_https_only=site.value("properties", "httpsOnly") is True,
        function_app_settings={name: source_text(value) for name, value in settings.items()},
        state_table=str(deployment.state_table().name),
        audit_table=str(deployment.audit_table().name),
        storage_shared_key_disabled=storage.value("properties", "allowSharedKeyAccess") is False,
        storage_min_tls=str(storage.value("properties", "minimumTlsVersion")),
        storage_public_blob_access=storage.value_or_none("properties", "allowBlobPublicAccess") is not False,
        app_insights_local_auth_disabled=deployment.one(APP_INSIGHTS).value("properties", "DisableLocalAuth") is True,
        grants=grants,
        drainer_actions=actions,
        drain_method_default=str(value_of(ParamRef(deployment.main, "drainMethod"))),
        trust_resource_groups_default=joined_setting_default(deployment, "MBRIDGE_TRUST_RESOURCE_GROUPS"),
        trust_subscriptions_default=joined_setting_default(deployment, "MBRIDGE_TRUST_SUBSCRIPTIONS"),
        drainer_assignable_to_resource_group=bool(assignable) and all(is_resource_group_id(s) for s in assignable),
        drain_without_virtual_network_refusal=drain_refusal(deployment, ""),
        drain_with_virtual_network_refusal=drain_refusal(deployment, DRAIN_VIRTUAL_NETWORK),
        **telemetry(deployment),
        vmss_terminate_notification_enabled=scale_set.value(*terminate, "enable") is True,
        vmss_not_before_parameter=not_before_parameter,
        not_before_allowed=allowed,
        not_before_default=not_before_default,
        vmss_uses_agent_identity=deployment.identity_of(scale_set) == deployment.agent_identity(),
        vmss_custom_data_from_cloud_init=built is not None and built.template == CLOUD_INIT.resolve(),
        vmss_health_probe_path=probe_path,
        vmss_health_probe_port=probe_port,
        vmss_event_grid_enable=render(deref(scale_set.get(*event_grid, "enable"))),
        vmss_event_grid_schema_version=str(scale_set.value(*event_grid, "scheduledEventsApiVersion")),
        vmss_event_grid_api_version=str(scale_set.unit.section("resources")[scale_set.symbol]["api_version"]),
        outputs=frozenset(_snake(name) for name in deployment.main.section("outputs")),
    )
