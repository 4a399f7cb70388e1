"""Read the resource declarations of Bicep files, with their property values and line numbers.

The parse tree comes from pycep's grammar (pycep-parser, the parser checkov uses), read before
pycep's own conversion to JSON: that conversion drops the line numbers and writes a parameter
reference (`location`) and a string literal (`'location'`) alike, and the check needs both.

A value is a literal (string, int, bool, null), an object, an array, a loop (`[for ...: body]`)
or an expression. Nothing is evaluated: an expression keeps only what is known without deploying,
its basic type where it is certain (a parameter's declared type, a variable's literal value, a
function that always returns one type) and the literal values it can take where they are written
down (the branches of `cond ? 'a' : 'b'`, a parameter's `@allowed` list).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Union

from lark import Token, Tree
from lark.exceptions import LarkError
from pycep import BicepParser
from pycep.validator import BicepValidator

# The keys of a resource body that are Bicep's own, not properties of the resource type.
LANGUAGE_KEYS = frozenset({"parent", "scope", "dependsOn"})

# Functions whose result always has one basic type (pycep's rule names). Functions missing here,
# or followed by a property access, are of unknown type.
_FUNCTION_TYPES: dict[str, str] = {
    **dict.fromkeys(
        (
            "unique_string",
            "guid",
            "new_guid",
            "format",
            "to_lower",
            "to_upper",
            "substring",
            "replace",
            "trim",
            "uri",
            "uri_component",
            "uri_component_to_string",
            "base64_func",
            "base64_to_string",
            "data_uri",
            "data_uri_to_string",
            "string_func",
            "pad_left",
            "join",
            "utc_now",
            "date_time_add",
            "load_text_content",
            "load_file_as_base64",
            "resource_id",
            "subscription_resource_id",
            "tenant_resource_id",
            "extension_resource_id",
            "management_group_resource_id",
        ),
        "string",
    ),
    **dict.fromkeys(("length", "int_func", "index_of", "last_index_of", "date_time_to_epoch"), "int"),
    **dict.fromkeys(("empty", "contains", "starts_with", "ends_with", "bool_func"), "bool"),
    **dict.fromkeys(("split", "array_func"), "array"),
}
# Parameter types Bicep declares with a keyword; any other name is a user-defined type.
_PARAMETER_TYPES = {
    "string": "string",
    "securestring": "string",
    "int": "int",
    "bool": "bool",
    "object": "object",
    "secureobject": "object",
    "array": "array",
}


class BicepSyntaxError(Exception):
    """A file the parser cannot read, at `line` (0 when not known)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Literal:
    line: int
    value: str | int | bool | None


@dataclass(frozen=True)
class Entry:
    """One `key: value` of an object; `key` is None when the key itself is an interpolated string."""

    key: str | None
    line: int
    value: Value


@dataclass(frozen=True)
class ObjectValue:
    line: int
    entries: tuple[Entry, ...]

    def get(self, key: str) -> Value | None:
        return next((entry.value for entry in self.entries if entry.key == key), None)


@dataclass(frozen=True)
class ArrayValue:
    line: int
    items: tuple[Value, ...]


@dataclass(frozen=True)
class LoopValue:
    """`[for ...: body]` as a property value: an array whose every element is `body`."""

    line: int
    body: Value


@dataclass(frozen=True)
class Expression:
    """A value computed at deployment. `basic` is its type where certain ('string', 'int', 'bool',
    'object', 'array'), `candidates` the literal values it can take where they are written down."""

    line: int
    text: str
    basic: str | None = None
    candidates: tuple[Value, ...] = ()


Value = Union[Literal, ObjectValue, ArrayValue, LoopValue, Expression]


@dataclass(frozen=True)
class Resource:
    """One resource declaration, top-level or nested in another resource's body."""

    path: Path
    symbol: str
    line: int
    type: str  # 'Microsoft.Storage/storageAccounts/blobServices', resolved for nested declarations
    api_version: str
    existing: bool
    body: ObjectValue
    conditional: bool = False
    in_loop: bool = False
    parented: bool = False  # declared with `parent:` or nested: `name` is the last segment only

    @property
    def type_key(self) -> str:
        return f"{self.type}@{self.api_version}"


@dataclass(frozen=True)
class Parameter:
    basic: str | None
    allowed: tuple[Value, ...]


@dataclass
class BicepFile:
    path: Path
    resources: list[Resource] = field(default_factory=list)
    parameters: dict[str, Parameter] = field(default_factory=dict)
    variables: dict[str, Tree[Token]] = field(default_factory=dict)


@lru_cache(maxsize=1)
def _parser() -> BicepParser:
    # Building the grammar takes a few tenths of a second: once per process.
    return BicepParser()


def read(path: Path, text: str | None = None) -> BicepFile:
    """The resource declarations of one Bicep file (its text, when given, instead of the file's)."""
    source = path.read_text(encoding="utf-8") if text is None else text
    if not BicepValidator.is_valid(source):
        raise BicepSyntaxError(path, 0, "unbalanced ''' (multi-line string)")
    try:
        tree = _parser().lark_parser.parse(source)
    except LarkError as error:
        line = getattr(error, "line", 0)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BicepSyntaxError(path, line if isinstance(line, int) else 0, f"pycep cannot parse it: {first}") from error
    reader = _Reader(BicepFile(path))
    reader.read(tree)
    return reader.file


class _Reader:
    def __init__(self, file: BicepFile) -> None:
        self.file = file
        self._converting: set[str] = set()

    def read(self, tree: Tree[Token]) -> None:
        elements = [child for child in tree.children if isinstance(child, Tree)]
        # Symbols first: a resource may read a parameter or variable declared below it.
        for element in elements:
            if element.data == "param":
                self._parameter(element)
            elif element.data == "var":
                self.file.variables[str(element.children[1])] = element
        for element in elements:
            if element.data == "resource":
                self._resource(element)

    def _parameter(self, element: Tree[Token]) -> None:
        decorators, name, data_type = element.children[0], element.children[1], element.children[2]
        declared = str(data_type.children[0]) if isinstance(data_type, Tree) else str(data_type)
        allowed: tuple[Value, ...] = ()
        if isinstance(decorators, Tree):
            for decorator in decorators.children:
                if isinstance(decorator, Tree) and decorator.data == "deco_allowed":
                    array = self.value(decorator.children[0])
                    if isinstance(array, ArrayValue):
                        allowed = array.items
        self.file.parameters[str(name)] = Parameter(_PARAMETER_TYPES.get(declared.lower()), allowed)

    def _resource(self, element: Tree[Token]) -> None:
        _, name, type_pair, existing, value = element.children
        full = _unquote(str(type_pair.children[0]) if isinstance(type_pair, Tree) else str(type_pair))
        resource_type, _, api_version = full.partition("@")
        line = _line(element)
        conditional, in_loop = False, False
        body = value
        # `[for ...: if (...) {...}]`, `if (...) {...}` or `{...}`
        if isinstance(body, Tree) and body.data == "loop":
            in_loop = True
            conditional = len(body.children) > 2 and body.children[1] is not None
            body = body.children[-1]
        if isinstance(body, Tree) and body.data == "deploy_condition":
            conditional = True
            body = body.children[-1]
        if not isinstance(body, Tree) or body.data != "object":
            raise BicepSyntaxError(self.file.path, line, f"resource {name}: the body is not an object")
        self._declare(str(name), line, resource_type, api_version, existing is not None, body, conditional, in_loop)

    def _declare(
        self,
        symbol: str,
        line: int,
        resource_type: str,
        api_version: str,
        existing: bool,
        body: Tree[Token],
        conditional: bool,
        in_loop: bool,
        nested: bool = False,
    ) -> None:
        entries: list[Entry] = []
        children: list[Tree[Token]] = []
        for child in body.children:
            if isinstance(child, Tree) and child.data == "pair":
                entries.append(self._entry(child))
            elif isinstance(child, Tree) and child.data == "child_resource":
                children.append(child)
        resource = Resource(
            path=self.file.path,
            symbol=symbol,
            line=line,
            type=resource_type,
            api_version=api_version,
            existing=existing,
            body=ObjectValue(_line(body), tuple(entries)),
            conditional=conditional,
            in_loop=in_loop,
            parented=nested or any(entry.key == "parent" for entry in entries),
        )
        self.file.resources.append(resource)
        for child in children:
            self._nested(resource, child)

    def _nested(self, parent: Resource, child: Tree[Token]) -> None:
        """`resource blob 'blobServices' = {...}` inside a body: the type is relative to the parent's
        and takes its API version unless it names one."""
        name, type_token, existing, body = child.children[:4]
        relative = _unquote(str(type_token))
        segment, _, api_version = relative.partition("@")
        resource_type = segment if "/" in segment and "." in segment.split("/")[0] else f"{parent.type}/{segment}"
        if not isinstance(body, Tree):
            raise BicepSyntaxError(self.file.path, _line(child), f"resource {name}: the body is not an object")
        self._declare(
            str(name),
            _line(child),
            resource_type,
            api_version or parent.api_version,
            existing is not None,
            body,
            parent.conditional,
            parent.in_loop,
            nested=True,
        )

    def _entry(self, pair: Tree[Token]) -> Entry:
        key_tree, value = pair.children[0], pair.children[1]
        token = key_tree.children[0] if isinstance(key_tree, Tree) else key_tree
        assert isinstance(token, Token)
        key: str | None = str(token)
        if token.type in ("QUOTED_STRING", "QUOTED_INTERPOLATION"):
            key = None if _interpolated(str(token)) else _unescape(str(token)[1:-1])
        return Entry(key, token.line or _line(pair), self.value(value))

    def value(self, node: Tree[Token] | Token | None) -> Value:
        """The value of one parse-tree node."""
        if not isinstance(node, Tree):
            return Expression(_line(node), str(node))
        line = _line(node)
        kind = node.data
        if kind == "null":
            return Literal(line, None)
        if kind in ("true", "false"):
            return Literal(line, kind == "true")
        if kind == "int":
            return Literal(line, int(str(node.children[0])))
        if kind == "multi_line_string":
            text = str(node.children[0])[3:-3]
            return Literal(line, text[1:] if text.startswith("\n") else text.removeprefix("\r\n"))
        if kind == "string":
            return self._string(node.children[0], line)
        if kind == "object":
            pairs = [child for child in node.children if isinstance(child, Tree) and child.data == "pair"]
            return ObjectValue(line, tuple(self._entry(pair) for pair in pairs))
        if kind == "array":
            return ArrayValue(line, tuple(self.value(child) for child in node.children if child is not None))
        if kind == "loop":
            return LoopValue(line, self.value(node.children[-1]))
        if kind == "function":
            function = node.children[0]
            name = function.data if isinstance(function, Tree) else str(function)
            return Expression(line, f"{name}(...)", _function_type(function))
        if kind == "operator":
            return self._operator(node, line)
        return Expression(line, str(kind))

    def _string(self, token: Tree[Token] | Token | None, line: int) -> Value:
        text = str(token)
        if isinstance(token, Token) and token.type == "STRING":
            return self._reference(text, line)
        if _interpolated(text):
            return Expression(line, text, "string")
        return Literal(line, _unescape(text[1:-1]))

    def _reference(self, name: str, line: int) -> Value:
        parameter = self.file.parameters.get(name)
        if parameter is not None:
            return Expression(line, name, parameter.basic, parameter.allowed)
        variable = self.file.variables.get(name)
        if variable is not None and name not in self._converting:
            self._converting.add(name)
            try:
                value = self.value(variable.children[2])
            finally:
                self._converting.discard(name)
            # The variable's value is written here: its type (and, literal, its value) is known.
            return Expression(line, name, _basic(value), (value,))
        return Expression(line, name)  # a resource, module, loop variable or output: not resolved

    def _operator(self, node: Tree[Token], line: int) -> Value:
        operation = node.children[0]
        if not isinstance(operation, Tree):
            return Expression(line, "operator")
        if operation.data == "minus" and isinstance(operation.children[0], Tree):
            operand = self.value(operation.children[0])
            if isinstance(operand, Literal) and isinstance(operand.value, int):
                return Literal(line, -operand.value)
        if operation.data == "conditional":
            # pycep's grammar has no operator precedence: only a conditional at the top is one for
            # certain, and only its literal branches are read.
            branches = [self.value(child) for child in operation.children[1:3]]
            basics = {_basic(branch) for branch in branches}
            basic = basics.pop() if len(basics) == 1 else None
            return Expression(line, "cond ? ... : ...", basic, tuple(branches))
        return Expression(line, str(operation.data))


def _basic(value: Value) -> str | None:
    if isinstance(value, Literal):
        if value.value is None:
            return None
        return {str: "string", bool: "bool", int: "int"}[type(value.value)]
    if isinstance(value, ObjectValue):
        return "object"
    if isinstance(value, (ArrayValue, LoopValue)):
        return "array"
    return value.basic


def _function_type(function: Tree[Token] | Token) -> str | None:
    if not isinstance(function, Tree):
        return None
    return _FUNCTION_TYPES.get(str(function.data))


def _line(node: Tree[Token] | Token | None) -> int:
    if isinstance(node, Token):
        return node.line or 0
    if isinstance(node, Tree) and not node.meta.empty:
        return node.meta.line
    return 0


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "'" else text


def _interpolated(quoted: str) -> bool:
    """Whether a quoted Bicep string holds `${...}` (an unescaped dollar followed by a brace)."""
    index = 0
    while index < len(quoted) - 1:
        if quoted[index] == "\\":
            index += 2
            continue
        if quoted[index] == "$" and quoted[index + 1] == "{":
            return True
        index += 1
    return False


_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t", "$": "$"}


def _unescape(text: str) -> str:
    """A Bicep string's content with its escapes (`\\'`, `\\n`, `\\u{41}`, ...) applied."""
    out: list[str] = []
    chars: Iterator[str] = iter(text)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        escaped = next(chars, "")
        if escaped == "u":
            code = ""
            for digit in chars:
                if digit == "}":
                    break
                if digit != "{":
                    code += digit
            out.append(chr(int(code, 16)) if code else "")
        else:
            out.append(_ESCAPES.get(escaped, escaped))
    return "".join(out)
