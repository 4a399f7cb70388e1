"""Notices of what the functions did, for people: which audit records are announced, and the JSON
body each one is posted as (docs/operations.md, "Notifications").

Pure: nothing here sends anything. `NotifyingAuditLog` wraps the AuditLog port; once a record is
appended it renders a `Notice` and hands it to the `Notifier` port, whose adapter
(`functions/notify/`) posts it from its own thread. Announcing is never part of acting: a notice
that cannot be rendered or handed over is logged and dropped, and the record and the action stand.
Records of reports nobody vouches for are not announced one by one but summarised, at most once
per interval (functions/core/refusals.py); every value is made inert as chat markup
(functions/core/chat_markup.py), as it comes from what a sender chose.

The body comes from a template of JSON text with `${name}` placeholders. Each value is inserted
JSON-escaped, so a placeholder must stand inside a JSON string (`"${summary}"`): a quote or a
newline in a VM's name or a reason can then never break the body, nor add fields to it. A template
is checked once, when the app reads its settings: an unknown placeholder, a placeholder outside a
string, or text that does not render to a JSON object is refused there, not found at send time.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

from functions.core.chat_markup import neutralised
from functions.core.log_fields import fields
from functions.core.ports import ActionName, AuditKind, AuditLog, AuditRecord, Finishing
from functions.core.refusals import DEFAULT_SUMMARY_SECONDS, RefusalDigest, RefusalSummary, is_refusal
from wire.bounds import bounded
from wire.timefmt import format_rfc3339

LOGGER = logging.getLogger("mbridge.functions.notify")

# The placeholders a template may use, and what each holds.
PLACEHOLDERS: Mapping[str, str] = {
    "summary": "one line for people: what happened to which VM, and why",
    "vm": "the VM the record is about (a wait names the VMs it waits for, separated by commas)",
    "event_id": "the cloud's event id (Azure EventId; GCE: the derived id)",
    "envelope_id": "the envelope id of the report (malformed: the digest of the message)",
    "kind": "what the audit record is about: event, decision, action, command-result or duplicate; refused "
    "for a summary of refused reports",
    "action": "for an action: drain, approve, restore, restore_failed, wait, none or perform_maintenance; "
    "for a command result: accepted or rejected; summary for a summary of refused reports",
    "result": "what came of it: done, failed, waiting, nothing, accepted, rejected, refused or duplicate "
    "(empty for an event or a decision)",
    "status": "the event's status in the report: scheduled, started, completed or canceled",
    "rule": "the policy rule behind a decision or an action (docs/policy.md)",
    "reason": "the audit record's reason",
    "event_kind": "the maintenance kind: freeze, reboot, redeploy, preempt, terminate, live_migrate, "
    "host_terminate, upcoming or unknown",
    "cloud": "azure or gce",
    "time": "when the record was written, RFC 3339 UTC",
    "at": "an approval's execute_at, RFC 3339 UTC (empty when it runs at once)",
    "trace_id": "the W3C trace id of the maintenance (empty when the record has none)",
}

# Slack's incoming webhooks and Teams' Incoming Webhook connector both post a body's "text".
DEFAULT_TEMPLATE = '{"text": "${summary}"}'
# A template is configuration, not a document: this is far beyond any card worth reading.
MAX_TEMPLATE_CHARS = 16 * 1024

# What a filter may name: an audit kind (every record of that kind), an action, a command's answer.
ANSWERS = ("accepted", "rejected")
ALL = "all"
FILTER_NAMES: tuple[str, ...] = (
    ALL,
    *(kind.value for kind in AuditKind),
    *(action.value for action in ActionName),
    *ANSWERS,
)
# By default: what was decided, what was done (or could not be done), and every refusal, but not
# the reports themselves (the decision says the same, with the rule), not the actions that did
# nothing (`none`: already drained, nothing to put back), duplicates, nor accepted commands (the
# approval was announced when it was sent; a rejection is a failure worth a look).
DEFAULT_FILTER: tuple[str, ...] = (
    AuditKind.DECISION.value,
    AuditKind.RECOVERY.value,
    AuditKind.AGENT_SILENT.value,
    ActionName.DRAIN.value,
    ActionName.APPROVE.value,
    ActionName.RESTORE.value,
    ActionName.RESTORE_FAILED.value,
    ActionName.WAIT.value,
    ActionName.PERFORM_MAINTENANCE.value,
    "rejected",
    AuditKind.UNVERIFIED.value,
    AuditKind.NOT_SELF.value,
    AuditKind.MALFORMED.value,
)

_PLACEHOLDER = re.compile(r"\$\$|\$\{([^}]*)(\}?)")
# Values that a placeholder outside a JSON string, or after a backslash, cannot survive.
_PROBE = 'x"\\\n\t}]{[,:<&>é'


class TemplateError(ValueError):
    """A webhook template that cannot be used; the message says what is wrong and where."""


class FilterError(ValueError):
    """A notification filter naming something that is neither an audit kind nor an action."""


@dataclass(frozen=True)
class _Slot:
    """A placeholder in a parsed template."""

    name: str


_Part = Union[str, _Slot]


@dataclass(frozen=True)
class WebhookTemplate:
    """A checked template: literal JSON text and placeholders, in order."""

    text: str
    parts: tuple[_Part, ...]

    @classmethod
    def parse(cls, text: str | None = None) -> WebhookTemplate:
        """The template `text` (None or blank: `DEFAULT_TEMPLATE`), checked.

        Raises:
            TemplateError: an unknown or unclosed placeholder, a placeholder right after a
                backslash, or text that does not render to a JSON object whatever the values.
        """
        if text is None or not text.strip():
            text = DEFAULT_TEMPLATE
        if len(text) > MAX_TEMPLATE_CHARS:
            raise TemplateError(f"the template has {len(text)} characters; at most {MAX_TEMPLATE_CHARS}")
        template = cls(text, tuple(_parts(text)))
        # Rendered with awkward values and with empty ones: a placeholder outside a string, or one
        # that only works for some values, fails one of the two here rather than at send time.
        for probe in (_PROBE, ""):
            rendered = template.render(dict.fromkeys(PLACEHOLDERS, probe))
            try:
                document = json.loads(rendered)
            except ValueError as error:
                raise TemplateError(
                    f"the template does not render to valid JSON ({error}); put each placeholder inside a JSON "
                    'string, as in {"text": "${summary}"}'
                ) from None
            if not isinstance(document, dict):
                raise TemplateError(f"the template renders to a JSON {type(document).__name__}, not an object")
        return template

    @property
    def names(self) -> tuple[str, ...]:
        """The placeholders it uses, each once, in order."""
        return tuple(dict.fromkeys(part.name for part in self.parts if isinstance(part, _Slot)))

    def render(self, values: Mapping[str, str]) -> str:
        """The JSON text with each placeholder replaced by its value, JSON-escaped (missing: empty)."""
        return "".join(part if isinstance(part, str) else _escaped(values.get(part.name, "")) for part in self.parts)


def _parts(text: str) -> Iterable[_Part]:
    position = 0
    for match in _PLACEHOLDER.finditer(text):
        yield text[position : match.start()]
        position = match.end()
        if match.group(0) == "$$":
            yield "$"
            continue
        name, closed = match.group(1), match.group(2)
        where = f"at character {match.start() + 1}"
        if not closed:
            raise TemplateError(f"the placeholder {where} is not closed with '}}'; write ${{name}}, or $$ for a '$'")
        if name not in PLACEHOLDERS:
            raise TemplateError(
                f"unknown placeholder ${{{name[:40]}}} {where}; known: {', '.join(sorted(PLACEHOLDERS))}"
            )
        backslashes = len(text[: match.start()]) - len(text[: match.start()].rstrip("\\"))
        if backslashes % 2:
            # The backslash would escape the first character of the value, and a quote in a
            # value could then end the string.
            raise TemplateError(f"the placeholder ${{{name}}} {where} follows a backslash")
        yield _Slot(name)
    yield text[position:]


def _escaped(value: str) -> str:
    """`value` as the inside of a JSON string literal."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


@dataclass(frozen=True)
class NoticeFilter:
    """Which audit records are announced: those whose kind, action or command answer is named."""

    names: frozenset[str]

    @classmethod
    def parse(cls, text: str | None = None) -> NoticeFilter:
        """Names separated by commas (None or blank: `DEFAULT_FILTER`; `all`: every record).

        Raises:
            FilterError: a name that is neither an audit kind, an action, an answer nor `all`.
        """
        names = [item.strip().lower() for item in (text or "").split(",") if item.strip()]
        for name in names:
            if name not in FILTER_NAMES:
                raise FilterError(f"{name[:60]!r} is not an audit kind or action; known: {', '.join(FILTER_NAMES)}")
        return cls(frozenset(names or DEFAULT_FILTER))

    def matches(self, record: AuditRecord) -> bool:
        if ALL in self.names or record.kind in self.names:
            return True
        # An action record's action, a command result's answer (kept in the same field).
        return record.kind in (AuditKind.ACTION, AuditKind.COMMAND_RESULT) and record.action in self.names


@dataclass(frozen=True)
class Notice:
    """One announcement, rendered: what the Notifier sends, and what its log lines name."""

    event_id: str
    vm: str
    kind: str
    action: str
    body: str
    # A summary of refused reports (functions/core/refusals.py): the notifier keeps these on a
    # queue of their own, so that they never take the place of a genuine notice.
    refusals: bool = False
    # The one line of `${summary}`, inert as chat markup: what a digest of several notices lists.
    line: str = ""
    # How many notices this one stands for (a digest: more than one).
    count: int = 1
    # A digest: the notices it stands for, in order (its log lines name each one's event).
    carried: tuple[Notice, ...] = ()


class Notifier(Protocol):
    """Sends notices somewhere people read them.

    `notify` must return at once and never raise: it is called on the processing path, right
    after the audit record is written. Sending, retrying, and logging and counting how it went
    are the adapter's, on its own time.
    """

    def notify(self, notice: Notice) -> None: ...


@runtime_checkable
class Settling(Protocol):
    """A notifier that can wait for what it was handed to go out."""

    def settle(self, timeout: float) -> bool: ...


class NotifyingAuditLog:
    """An AuditLog that announces the records the filter names, once they are written.

    The record is appended first: if the log refuses it, nothing is announced (the invocation
    fails and is retried). Whatever goes wrong in announcing is logged and nothing more.

    A refused record (unverified, not-self, malformed) is never announced on its own: it is
    counted into a summary, handed over at most once per `summary_seconds` (functions/core/
    refusals.py). A summary falls due on an append or a `settle` after its time; for when neither
    comes, `on_held` is told how many seconds are left whenever refusals are held, so that the
    adapter can call `summarise_due` then.
    """

    def __init__(
        self,
        inner: AuditLog,
        notifier: Notifier,
        template: WebhookTemplate | None = None,
        notice_filter: NoticeFilter | None = None,
        cloud: str = "",
        *,
        summary_seconds: float = DEFAULT_SUMMARY_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        on_held: Callable[[float], None] | None = None,
    ) -> None:
        self._inner = inner
        self._notifier = notifier
        self._template = template or WebhookTemplate.parse()
        self._filter = notice_filter or NoticeFilter.parse()
        self._cloud = cloud  # when a record does not say (command results, malformed messages)
        self._refusals = RefusalDigest(summary_seconds, monotonic)
        self._on_held = on_held

    def append(self, record: AuditRecord) -> None:
        self.append_all([record])

    def append_all(self, records: Sequence[AuditRecord], then: Finishing | None = None) -> None:
        self._inner.append_all(records, then)
        for record in records:
            try:
                if self._filter.matches(record):
                    if is_refusal(record):
                        self._refusals.add(record)
                    else:
                        self._notifier.notify(notice_for(record, self._template, self._cloud))
            except Exception:  # an announcement must never fail the action it announces
                LOGGER.exception(
                    "notice of %s %s for event %s not sent",
                    record.kind,
                    record.action,
                    record.event_id,
                    extra=fields(event_id=record.event_id, vm=record.vm),
                )
        self.summarise_due()

    def summarise_due(self) -> None:
        """Hand over the summary of the refusals held, if one is due; else say when it will be."""
        try:
            summary = self._refusals.take_due()
            if summary is None:
                wait = self._refusals.seconds_until_due()
                if wait is not None and self._on_held is not None:
                    self._on_held(wait)
                return
            LOGGER.info("%s refused since %s: one summary notice", summary.tally(), format_rfc3339(summary.first))
            self._notifier.notify(summary_notice(summary, self._template, self._cloud))
        except Exception:  # as for any notice: logged, and the records stand
            LOGGER.exception("the summary of refused reports was not sent")

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the notices handed over to go out, a summary that fell
        due included; True when none is left (or the notifier cannot wait), False when time ran out."""
        self.summarise_due()
        if isinstance(self._notifier, Settling):
            return self._notifier.settle(timeout)
        return True

    def query(self, *, vm: str | None = None, event_id: str | None = None) -> Sequence[AuditRecord]:
        return self._inner.query(vm=vm, event_id=event_id)


def notice_for(record: AuditRecord, template: WebhookTemplate, cloud: str = "") -> Notice:
    """The record rendered through the template."""
    values = notice_values(record, cloud)
    body = template.render(values)
    return Notice(record.event_id, record.vm, str(record.kind), str(record.action), body, line=values["summary"])


# A digest's `${summary}` may be longer than one record's: chat webhooks take tens of kilobytes
# (Slack 40,000 characters of text, Teams about 28 KB per message); this keeps well under both.
MAX_DIGEST_TEXT = 8000
DIGEST_PREFIX = "[maintenance-bridge] "


def digest_notice(notices: Sequence[Notice], template: WebhookTemplate, cloud: str = "") -> Notice:
    """Several notices as one post (`${kind}` and `${action}` are `digest`): a webhook that takes
    about one post a second (Slack) would otherwise fall behind a wave of drains and drop notices.
    `${summary}` lists each notice's line in order; `${vm}` and `${event_id}` name the distinct VMs
    and events, comma-separated; every value was made inert before, or is made inert here."""
    lines = [notice.line.removeprefix(DIGEST_PREFIX) for notice in notices]
    count = sum(notice.count for notice in notices)
    values = dict.fromkeys(PLACEHOLDERS, "")
    values.update(
        {
            "summary": bounded(f"{DIGEST_PREFIX}{count} notices: " + " | ".join(lines), MAX_DIGEST_TEXT),
            "vm": neutralised(bounded(", ".join(dict.fromkeys(n.vm for n in notices if n.vm)))),
            "event_id": neutralised(bounded(", ".join(dict.fromkeys(n.event_id for n in notices if n.event_id)))),
            "kind": "digest",
            "action": "digest",
            "cloud": neutralised(cloud),
        }
    )
    carried = tuple(part for notice in notices for part in (notice.carried or (notice,)))
    return Notice(
        "", "", "digest", "digest", template.render(values), line=values["summary"], count=count, carried=carried
    )


def summary_notice(summary: RefusalSummary, template: WebhookTemplate, cloud: str = "") -> Notice:
    """The refusals rendered through the template as one notice: `${kind}` is `refused`,
    `${action}` `summary`, `${reason}` the count of each kind; nothing names one VM or event
    (the claimed names are in the summary's samples, cut short)."""
    values = dict.fromkeys(PLACEHOLDERS, "")
    values.update(
        {
            "summary": bounded(summary.text()),
            "kind": "refused",
            "action": "summary",
            "result": "refused",
            "reason": summary.tally(),
            "cloud": cloud,
            "time": format_rfc3339(summary.last),
        }
    )
    body = template.render({name: neutralised(value) for name, value in values.items()})
    return Notice("", "", "refused", "summary", body, refusals=True)


def notice_values(record: AuditRecord, cloud: str = "") -> dict[str, str]:
    """Every placeholder's value for the record, its chat markup made inert (functions/core/chat_markup.py)."""
    detail = record.detail
    values = {
        "vm": record.vm,
        "event_id": record.event_id,
        "envelope_id": record.envelope_id,
        "kind": str(record.kind),
        "action": str(record.action),
        "result": _result(record),
        "status": record.status,
        "rule": record.rule,
        "reason": record.reason,
        "event_kind": str(detail.get("kind", "")),
        "cloud": str(detail.get("cloud", "") or cloud),
        "time": format_rfc3339(record.time),
        "at": format_rfc3339(record.at) if record.at else "",
        "trace_id": record.trace_id,
    }
    values["summary"] = bounded(_summary(values))
    # Last, and once: the headline is ours, but it quotes the record (an entity escaped twice would
    # show as `&amp;lt;`).
    return {name: neutralised(value) for name, value in values.items()}


_RESULTS = {
    ActionName.DRAIN.value: "done",
    ActionName.APPROVE.value: "done",
    ActionName.RESTORE.value: "done",
    ActionName.PERFORM_MAINTENANCE.value: "done",
    ActionName.RESTORE_FAILED.value: "failed",
    ActionName.WAIT.value: "waiting",
    ActionName.NONE.value: "nothing",
}


def _result(record: AuditRecord) -> str:
    if record.kind == AuditKind.ACTION:
        return _RESULTS.get(record.action, "")
    if record.kind == AuditKind.COMMAND_RESULT:
        return record.action
    if is_refusal(record):
        return "refused"
    if record.kind == AuditKind.DUPLICATE:
        return "duplicate"
    return ""


def _summary(values: Mapping[str, str]) -> str:
    """One line for a chat channel: the headline, then the record's reason."""
    vm, event, status = values["vm"], values["event_id"], values["status"]
    what = f"{values['event_kind'] or 'maintenance'} {event}".strip()
    kind, action = values["kind"], values["action"]
    if kind == AuditKind.ACTION:
        headlines = {
            ActionName.DRAIN.value: f"{vm} taken out of its pools for {what} ({status})",
            ActionName.APPROVE.value: f"{vm}: {what} approved"
            + (f", to start at {values['at']}" if values["at"] else ", to start now"),
            ActionName.RESTORE.value: f"{vm} put back after {what} ({status})",
            ActionName.RESTORE_FAILED.value: f"{vm} could NOT be put back after {what} ({status})",
            ActionName.WAIT.value: f"{vm}: {what} waits for a disruption budget slot",
            ActionName.PERFORM_MAINTENANCE.value: f"{vm}: maintenance started now for {what}",
        }
        headline = headlines.get(action, f"{vm}: nothing done for {what} ({status})")
    elif kind == AuditKind.DECISION:
        headline = f"{vm}: {what} {status}, rule {values['rule']}"
    elif kind == AuditKind.EVENT:
        headline = f"{vm} reports {what} {status}"
    elif kind == AuditKind.COMMAND_RESULT:
        headline = f"{vm} {action} the command for event {event}"
    elif kind == AuditKind.DUPLICATE:
        headline = f"{vm}: {what} {status} reported again, already processed"
    elif kind == AuditKind.MALFORMED:
        headline = f"a message that cannot be acted on (digest {values['envelope_id'][:16]})"
    elif kind == AuditKind.AGENT_SILENT:
        headline = f"{vm}'s agent is silent: the control plane reports {what} {status}"
    else:
        headline = f"a report of {what} by {vm} not acted on ({kind})"
    reason = values["reason"]
    return f"[maintenance-bridge] {headline}" + (f": {reason}" if reason else "")
