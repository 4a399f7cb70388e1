"""Drill 6: fuzzing the parsers at the edges, 10,000 examples each (hypothesis, derandomized).

Property: any input either parses or raises the module's documented error, with a message that is
not empty; never another exception. The inputs mix random bytes and text, random JSON-like values,
and mutations of valid documents (tests/fixtures/ and valid commands): a field replaced, removed or
added, the document re-encoded (UTF-8, UTF-16, text with lone surrogates) or its bytes damaged. The
replacements come from a small dictionary of values that parsers get wrong: timestamps at the edges
of the calendar, digits that are not decimal, lone surrogates, deep nesting.

Found and fixed: the first runs found inputs that escaped as other exceptions (RecursionError on
deep nesting, OverflowError at the ends of the calendar, UnicodeEncodeError on lone surrogates,
ValueError on digits that are not decimal). Each class is pinned by an exact example in
`test_found_input_is_refused_with_the_documented_error`, so it cannot come back unseen.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.sources.azure.document import parse_scheduled_events
from agent.sources.gce.values import parse_maintenance_event, parse_preempted, parse_upcoming_maintenance
from tests.drills.conftest import say
from tests.fixtures import FIXTURES, fixture_json, fixture_text
from wire.commands import (
    CommandType,
    MalformedCommandError,
    decode_command,
    encode_command,
    new_command,
)
from wire.envelope import decode, encode, envelope_for_command_result
from wire.errors import MalformedDocumentError, MalformedEnvelopeError
from wire.model import Cloud, CommandResult
from wire.signing import BadSignatureError, generate_keypair, load_private_key, load_public_key, sign_command
from wire.signing import verify as verify_signature

pytestmark = [pytest.mark.drill, pytest.mark.timeout(60)]

EXAMPLES = 10_000
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    database=None,
    suppress_health_check=list(HealthCheck),
)


def check(parse: Callable[[Any], object], data: Any, documented: type[Exception]) -> str:
    """Parse `data`: 'parsed', or 'refused' (the documented error, with a message). Anything else fails."""
    try:
        parse(data)
    except documented as error:
        message = str(error).strip()
    else:
        return "parsed"
    assert message, f"{documented.__name__} without a message for {data!r:.200}"
    return "refused"


# ---------------------------------------------------------------------------------------- the dictionary

ANY_CHARACTER = st.characters(exclude_categories=())  # lone surrogates included
TRICKY_TEXT = [
    "", " ", "\x00", "\n", "\t7", "\ud800", "\udfff", "\u2028", "\ufeff", "²", "①", "٣", "\uff11\uff12", "\U0001d7d8",
    "-", "--5", "+5", " 7 ", "0x10", "1e3", "1" * 5000, "9" * 40, "-0", "NaN", "Infinity", "null", "true",
    "Scheduled", "Started", "scheduled", "Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "Platform",
    "User", "user", "approve", "drain", "restore", "NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TRUE", "FALSE",
    "azure", "gce", "1.0", "application/json",
]  # fmt: skip
EDGE_DATES = ["0000-01-01", "0001-01-01", "9999-12-31", "2024-02-29", "2023-02-29", "2024-13-01", "2024-00-10"]
INTERESTING_NUMBERS = [0, -1, 1, 2**31, -(2**63), 2**64, 10**400, 1e308, -0.0, float("inf"), float("nan")]


CALENDAR_ENDS = [("9999-12-31", 23, "-"), ("0001-01-01", 0, "+")]  # the last and first day, and the
# sign of an offset that moves the UTC time past that end


@st.composite
def rfc3339(draw: st.DrawFn) -> str:
    """RFC 3339-shaped text: a third at an end of the calendar, a third on odd dates, a third random
    (impossible fields included)."""
    shape = draw(st.integers(0, 2))
    if shape == 0:
        date, hour, sign = draw(st.sampled_from(CALENDAR_ENDS))
        zone = f"{sign}{draw(st.integers(0, 23)):02d}:{draw(st.integers(0, 59)):02d}"
        return f"{date}T{hour:02d}:{draw(st.integers(0, 59)):02d}:{draw(st.integers(0, 59)):02d}{zone}"
    if shape == 1:
        date = draw(st.sampled_from(EDGE_DATES))
    else:
        date = f"{draw(st.integers(0, 9999)):04d}-{draw(st.integers(0, 13)):02d}-{draw(st.integers(0, 32)):02d}"
    clock = f"{draw(st.integers(0, 25)):02d}:{draw(st.integers(0, 61)):02d}:{draw(st.integers(0, 61)):02d}"
    fraction = draw(st.sampled_from(["", ".5", ".123", ".999999999", ".1234567890123"]))
    offset = st.builds(
        lambda s, h, m: f"{s}{h:02d}:{m:02d}", st.sampled_from("+-"), st.integers(0, 25), st.integers(0, 61)
    )
    zone = draw(st.sampled_from(["Z", "z", ""]) | offset)
    return f"{date}{draw(st.sampled_from('Tt '))}{clock}{fraction}{zone}"


@st.composite
def rfc1123(draw: st.DrawFn) -> str:
    """Azure NotBefore-shaped text: half at an end of the calendar, half random."""
    if draw(st.booleans()):
        date, hour, sign = draw(st.sampled_from(CALENDAR_ENDS))
        year, month, day = date.split("-")
        zone = f"{sign}{draw(st.integers(0, 23)):02d}{draw(st.integers(0, 59)):02d}"
        name = "Dec" if month == "12" else "Jan"
        return f"Fri, {day} {name} {year} {hour:02d}:{draw(st.integers(0, 59)):02d}:59 {zone}"
    weekday = draw(st.sampled_from(["Mon", "Fri", "Xyz"]))
    month_name = draw(st.sampled_from(["Jan", "Feb", "Dec", "Foo"]))
    year_number = draw(st.sampled_from([1, 1970, 2022, 9999]) | st.integers(0, 10000))
    offset = draw(st.sampled_from(["GMT", "UTC", "+0000", "-2359", "+2359", "-9999", ""]))
    clock = f"{draw(st.integers(0, 25)):02d}:{draw(st.integers(0, 61)):02d}:{draw(st.integers(0, 61)):02d}"
    return f"{weekday}, {draw(st.integers(0, 32)):02d} {month_name} {year_number:04d} {clock} {offset}"


SURROGATED = st.builds(lambda before, lone, after: before + lone + after, st.text(max_size=8),
                       st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]), st.text(max_size=8))  # fmt: skip
TEXT = st.text(ANY_CHARACTER, max_size=24) | st.sampled_from(TRICKY_TEXT) | SURROGATED | rfc3339() | rfc1123()
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(INTERESTING_NUMBERS)
    | TEXT
)
# Flat on purpose: st.recursive is several times slower, and depth is what BOMBS are for.
JSON_VALUES = SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(TEXT, SCALARS, max_size=3)
DIGITS = st.sampled_from(
    ["²", "①", "٣", "\uff11\uff12", "\U0001d7d8", "--5", "-", "+5", " 7 ", "1" * 5000, "-" + "9" * 30]
)
TIMESTAMP = re.compile(r"^\d{4}-")
NOT_BEFORE = re.compile(r"^[A-Z][a-z]{2}, ")


def like(value: Any) -> st.SearchStrategy[Any]:
    """Replacements of the same shape as `value` half of the time: a timestamp for a timestamp, digits
    for a number (a parser's deepest checks are behind the shape), anything the other half."""
    if isinstance(value, str) and TIMESTAMP.match(value):
        return rfc3339() | JSON_VALUES
    if isinstance(value, str) and NOT_BEFORE.match(value):
        return rfc1123() | JSON_VALUES
    if isinstance(value, int) and not isinstance(value, bool):
        return DIGITS | st.integers().map(str) | JSON_VALUES
    return JSON_VALUES | st.sampled_from(INTERESTING_NUMBERS)


BOMBS = st.integers(1_000, 20_000).flatmap(
    lambda depth: st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "[" * depth])
)


# ---------------------------------------------------------------------------------------- mutations

TreePath = tuple[Any, ...]


def paths(value: Any, prefix: TreePath = ()) -> list[TreePath]:
    """Every place in a JSON tree: the root, each container and each leaf."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(paths(item, (*prefix, index)))
    return found


def _parent(document: Any, path: TreePath) -> Any:
    for step in path[:-1]:
        document = document[step]
    return document


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """A valid document with one to three changes: a value replaced, a field removed or added."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(document)))
        if not path:
            replacement = draw(JSON_VALUES)
            if draw(st.integers(0, 9)) == 0:  # seldom: the whole document replaced
                document = replacement
            continue
        parent = _parent(document, path)
        current = parent[path[-1]]
        replacement = draw(like(current))
        action = draw(st.sampled_from(["replace", "replace", "remove", "add", "rename"]))
        if action == "rename" and isinstance(current, str):
            # the same value everywhere it appears (an id is repeated: subject and data.event_id)
            document = _renamed(document, current, draw(TEXT))
        elif action in ("replace", "rename"):
            parent[path[-1]] = replacement
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(TEXT)] = replacement
        else:
            parent.insert(path[-1], replacement)
    return document


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {key: _renamed(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed(item, old, new) for item in value]
    return new if value == old else value


@st.composite
def on_the_wire(draw: st.DrawFn, document: Any) -> str | bytes:
    """A document as a message body: text, UTF-8 or UTF-16 bytes, invalid UTF-8, or damaged bytes."""
    ascii_only = draw(st.booleans())
    text = json.dumps(document, ensure_ascii=ascii_only)
    form = draw(st.sampled_from(["text", "utf-8", "utf-8", "utf-16", "damaged", "bomb"]))
    if form == "text":
        return text
    raw = text.encode("utf-8", errors="surrogatepass")  # a lone surrogate makes invalid UTF-8
    if form == "utf-16":
        return text.encode("utf-16", errors="surrogatepass")
    if form == "damaged" and raw:
        position = draw(st.integers(0, len(raw) - 1))
        how = draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip":
            return raw[:position] + bytes([raw[position] ^ draw(st.integers(1, 255))]) + raw[position + 1 :]
        if how == "cut":
            return raw[:position]
        return raw[:position] + draw(st.binary(min_size=1, max_size=4)) + raw[position:]
    if form == "bomb" and raw:
        # a value's place taken by deep nesting
        position = draw(st.integers(0, len(raw) - 1))
        return raw[:position] + draw(BOMBS).encode() + raw[position:]
    return raw


def documents(bases: list[Any]) -> st.SearchStrategy[str | bytes]:
    """Random bytes and text, random JSON values, and mutated valid documents on the wire."""
    return st.one_of(
        st.binary(max_size=64),
        st.text(ANY_CHARACTER, max_size=64),
        JSON_VALUES.flatmap(on_the_wire),
        BOMBS,
        st.sampled_from(bases).flatmap(mutated).flatmap(on_the_wire),
        st.sampled_from(bases).flatmap(mutated).flatmap(on_the_wire),
        st.sampled_from(bases).flatmap(on_the_wire),
    )


@st.composite
def mutated_text(draw: st.DrawFn, base: str) -> str | bytes:
    """A GCE value with characters changed, its case changed, or spaces around it."""
    text = base
    how = draw(st.sampled_from(["insert", "delete", "case", "pad", "bytes"]))
    position = draw(st.integers(0, len(text)))
    if how == "insert":
        text = text[:position] + draw(st.text(ANY_CHARACTER, min_size=1, max_size=3)) + text[position:]
    elif how == "delete":
        text = text[:position] + text[position + 1 :]
    elif how == "case":
        text = text.lower() if draw(st.booleans()) else text.swapcase()
    elif how == "pad":
        text = (
            draw(st.sampled_from([" ", "\n", "\t", "\x00", "\ufeff"])) + text + draw(st.sampled_from(["", "\n", " "]))
        )
    else:
        return text.encode("utf-8") + draw(st.binary(max_size=4))
    return text


def values(bases: list[str]) -> st.SearchStrategy[str | bytes]:
    return st.one_of(
        st.binary(max_size=32),
        st.text(ANY_CHARACTER, max_size=32),
        st.sampled_from(TRICKY_TEXT),
        st.sampled_from(bases).flatmap(mutated_text),
        st.sampled_from(bases).flatmap(mutated_text),
    )


# ---------------------------------------------------------------------------------------- the bases

AZURE_DOCUMENTS = [fixture_json(f"azure/{path.name}") for path in sorted((FIXTURES / "azure").glob("*.json"))]
ENVELOPES = [fixture_json(f"envelopes/{path.name}") for path in sorted((FIXTURES / "envelopes").glob("*.json"))]
ISSUED = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
ENVELOPES.append(
    json.loads(
        encode(
            envelope_for_command_result(
                CommandResult("4f1c2a9d0b7e4c3f8a6d5e2b1c0f9a87", False, "E1", "vm-0", "expired: ..."),
                Cloud.AZURE,
                ISSUED,
            )
        )
    )
)
PRIVATE_PEM, PUBLIC_PEM = generate_keypair()
SIGNING_KEY, VERIFY_KEY = load_private_key(PRIVATE_PEM), load_public_key(PUBLIC_PEM)
_APPROVE = new_command(CommandType.APPROVE, target="WestNO_0", event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                       issued_at=ISSUED, execute_at=ISSUED + timedelta(seconds=30))  # fmt: skip
_DRAIN = new_command(CommandType.DRAIN, target="vm-0", event_id="E1", issued_at=ISSUED)
COMMANDS = [json.loads(encode_command(command)) for command in (_APPROVE, sign_command(_APPROVE, SIGNING_KEY))]
COMMANDS.append(json.loads(encode_command(sign_command(_DRAIN, SIGNING_KEY))))
GCE_MAINTENANCE = [fixture_text(f"gce/maintenance-event-{name}.txt") for name in ("none", "migrate", "terminate")]
GCE_PREEMPTED = [fixture_text("gce/preempted-true.txt"), fixture_text("gce/preempted-false.txt")]
GCE_UPCOMING = [fixture_json("gce/upcoming-maintenance.json")]
GCE_UPCOMING_TEXT = fixture_text("gce/upcoming-maintenance-as-documented.txt")


def decode_and_verify(data: Any) -> object:
    """The command decoder, then the signature check a keyed agent runs on what decoded."""
    received = decode_command(data)
    if received.command.signature is not None:
        try:
            verify_signature(received.canonical, received.command.signature, VERIFY_KEY)
        except BadSignatureError as error:
            raise MalformedCommandError(f"(signature refused: {error})") from error
    return received


# ---------------------------------------------------------------------------------------- the drills


def fuzz(
    name: str,
    parse: Callable[[Any], object],
    inputs: st.SearchStrategy[Any],
    documented: type[Exception],
) -> None:
    started = time.monotonic()
    outcomes: Counter[str] = Counter()

    @FUZZ
    @given(inputs)
    def property_holds(data: Any) -> None:
        outcomes[check(parse, data, documented)] += 1

    property_holds()
    examples = sum(outcomes.values())
    say(f"fuzz-{name}", examples=examples, **dict(outcomes), duration_s=round(time.monotonic() - started, 1))
    # THEN 10,000 examples ran, and they reached both sides: documents that parse and ones refused
    assert examples >= EXAMPLES, outcomes
    assert outcomes["parsed"], outcomes
    assert outcomes["refused"], outcomes


def test_fuzz_azure_scheduled_events_parser() -> None:
    # GIVEN the recorded IMDS documents WHEN 10,000 inputs (random and mutated) are parsed
    # THEN each parses or raises MalformedDocumentError with a message
    inputs = documents(AZURE_DOCUMENTS)
    fuzz("azure-document", parse_scheduled_events, inputs, MalformedDocumentError)


def test_fuzz_gce_maintenance_event_parser() -> None:
    fuzz("gce-maintenance-event", parse_maintenance_event, values(GCE_MAINTENANCE), MalformedDocumentError)


def test_fuzz_gce_preempted_parser() -> None:
    fuzz("gce-preempted", parse_preempted, values(GCE_PREEMPTED), MalformedDocumentError)


def test_fuzz_gce_upcoming_maintenance_parser() -> None:
    inputs = documents(GCE_UPCOMING) | st.just(GCE_UPCOMING_TEXT) | mutated_text(GCE_UPCOMING_TEXT)
    fuzz("gce-upcoming-maintenance", parse_upcoming_maintenance, inputs, MalformedDocumentError)


def test_fuzz_envelope_decoder() -> None:
    # decode() also takes an already parsed object (a Pub/Sub push body): mutated objects go in as such too
    inputs = documents(ENVELOPES) | st.sampled_from(ENVELOPES).flatmap(mutated).filter(lambda d: isinstance(d, dict))
    fuzz("envelope", decode, inputs, MalformedEnvelopeError)


def test_fuzz_command_decoder_and_signature_check() -> None:
    fuzz("command", decode_and_verify, documents(COMMANDS), MalformedCommandError)


# ---------------------------------------------------------------------------------------- found inputs


def _azure(**changes: Any) -> str:
    document = copy.deepcopy(AZURE_DOCUMENTS[1])
    document["Events"][0].update(changes)
    return json.dumps(document)


def _envelope(**data: Any) -> str:
    document = copy.deepcopy(ENVELOPES[1])
    document["data"].update(data)
    if "event_id" in data:
        document["subject"] = data["event_id"]
    return json.dumps(document)


def _command(**fields: Any) -> bytes:
    return json.dumps({**COMMANDS[0], **fields}).encode()


def _pin(parser: str, found: str, parse: Callable[[Any], object], data: Any, documented: type[Exception]) -> Any:
    """One input the fuzzing found escaping as another exception, before the parsers were fixed."""
    return pytest.param(parse, data, documented, id=f"{parser}-{found}")


LAST_SECOND = "9999-12-31T23:59:59-23:59"  # in UTC: 10000-01-01T23:58:59Z
FOUND = [
    _pin("azure", "deep-nesting", parse_scheduled_events, "[" * 5000, MalformedDocumentError),
    _pin("azure", "5000-digits", parse_scheduled_events, json.dumps({"DocumentIncarnation": "1" * 5000, "Events": []}),
         MalformedDocumentError),
    _pin("upcoming", "deep-nesting", parse_upcoming_maintenance, '{"a":' * 5000, MalformedDocumentError),
    _pin("envelope", "deep-nesting", decode, "[" * 5000, MalformedEnvelopeError),
    _pin("envelope", "calendar-edge", decode, _envelope(not_before="0001-01-01T00:00:00+23:59"),
         MalformedEnvelopeError),
    _pin("envelope", "lone-surrogate", decode, _envelope(event_id="\ud800"), MalformedEnvelopeError),
    _pin("command", "deep-nesting", decode_command, b"[" * 5000, MalformedCommandError),
    _pin("command", "calendar-edge", decode_command, _command(expires_at=LAST_SECOND),
         MalformedCommandError),
    _pin("command", "lone-surrogate", decode_command, _command(event_id="\ud800"), MalformedCommandError),
]  # fmt: skip


@pytest.mark.parametrize(("parse", "data", "documented"), FOUND)
def test_found_input_is_refused_with_the_documented_error(
    parse: Callable[[Any], object], data: Any, documented: type[Exception]
) -> None:
    # GIVEN an input the fuzzing found WHEN it is parsed THEN the documented error says what is wrong
    with pytest.raises(documented) as refused:
        parse(data)
    assert str(refused.value).strip()


# Field values the fuzzing found escaping as other exceptions: since entries are read field by field,
# each is now read as an unreadable field of an event that is still forwarded.
FOUND_IN_FIELDS = [
    pytest.param(lambda: parse_scheduled_events(_azure(DurationInSeconds="²")).events[0], "DurationInSeconds",
                 id="azure-superscript-digit"),
    pytest.param(lambda: parse_scheduled_events(_azure(DurationInSeconds="--5")).events[0], "DurationInSeconds",
                 id="azure-double-minus"),
    pytest.param(lambda: parse_scheduled_events(_azure(NotBefore="Fri, 31 Dec 9999 23:59:59 -2359")).events[0],
                 "NotBefore", id="azure-calendar-edge"),
    pytest.param(lambda: parse_upcoming_maintenance(json.dumps({"windowStartTime": LAST_SECOND})),
                 "windowStartTime", id="upcoming-calendar-edge"),
]  # fmt: skip


@pytest.mark.parametrize(("read", "field"), FOUND_IN_FIELDS)
def test_found_field_values_are_read_as_unreadable_fields(read: Callable[[], Any], field: str) -> None:
    # GIVEN an entry with a value the fuzzing found WHEN it is read THEN that field is named, with a reason
    reading = read()
    assert list(reading.unreadable) == [field]
    assert reading.unreadable[field].strip()
