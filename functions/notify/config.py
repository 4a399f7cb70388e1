"""The webhook settings both function apps read, checked once when an app starts.

Each app names the settings (its own constants, docs/azure.md and docs/gcp.md) and turns a
`WebhookConfigError` into its own SettingsError; the message already names the setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from functions.core.notify import FilterError, NoticeFilter, TemplateError, WebhookTemplate
from functions.core.refusals import DEFAULT_SUMMARY_SECONDS
from functions.notify.webhook import WebhookUrlError, check_url

WEBHOOK_URL = "MBRIDGE_WEBHOOK_URL"
WEBHOOK_TEMPLATE = "MBRIDGE_WEBHOOK_TEMPLATE"
WEBHOOK_ACTIONS = "MBRIDGE_WEBHOOK_ACTIONS"
WEBHOOK_SUMMARY_SECONDS = "MBRIDGE_WEBHOOK_SUMMARY_SECONDS"
# The summary interval's bounds: a summary a second would be the flood again; one an hour is as
# late as anyone should hear that reports are refused.
MIN_SUMMARY_SECONDS = 1.0
MAX_SUMMARY_SECONDS = 3600.0


class WebhookConfigError(ValueError):
    """A webhook setting that is wrong; the message starts with the setting's name."""


@dataclass(frozen=True)
class WebhookConfig:
    """Where notices go, what they look like, and which audit records make one."""

    url: str = field(repr=False)  # a secret: the key is in its path
    template: WebhookTemplate
    notice_filter: NoticeFilter
    summary_seconds: float = DEFAULT_SUMMARY_SECONDS  # at most one summary of refused reports per this


def webhook_config(
    url: str | None, template: str | None, actions: str | None, summary_seconds: str | None = None
) -> WebhookConfig | None:
    """The webhook the settings give, or None when `url` is unset (no notices).

    The template, the filter and the summary interval are checked even then: a half-removed
    configuration is named, not ignored.

    Raises:
        WebhookConfigError: naming the setting that is wrong.
    """
    try:
        parsed_template = WebhookTemplate.parse(template)
    except TemplateError as error:
        raise WebhookConfigError(f"{WEBHOOK_TEMPLATE}: {error}") from None
    try:
        notice_filter = NoticeFilter.parse(actions)
    except FilterError as error:
        raise WebhookConfigError(f"{WEBHOOK_ACTIONS}: {error}") from None
    interval = _summary_seconds(summary_seconds)
    if not url:
        given = ((WEBHOOK_TEMPLATE, template), (WEBHOOK_ACTIONS, actions), (WEBHOOK_SUMMARY_SECONDS, summary_seconds))
        set_alone = [name for name, value in given if value]
        if set_alone:
            raise WebhookConfigError(
                f"{' and '.join(set_alone)} set without {WEBHOOK_URL}: set the URL to send notices, or clear "
                f"{' and '.join(set_alone)}"
            )
        return None
    try:
        checked = check_url(url)
    except WebhookUrlError as error:
        raise WebhookConfigError(f"{WEBHOOK_URL}: {error}") from None
    return WebhookConfig(checked, parsed_template, notice_filter, interval)


def _summary_seconds(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_SUMMARY_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not MIN_SUMMARY_SECONDS <= seconds <= MAX_SUMMARY_SECONDS:  # (NaN is in no range)
        raise WebhookConfigError(
            f"{WEBHOOK_SUMMARY_SECONDS}: {text[:40]!r} is not a number of seconds from {MIN_SUMMARY_SECONDS:g} to "
            f"{MAX_SUMMARY_SECONDS:g} (at most one summary of refused reports per this many seconds)"
        )
    return seconds
