"""The webhook settings both function apps read, checked once when an app starts.

Each app names the settings (its own constants, docs/azure.md and docs/gcp.md) and turns a
`WebhookConfigError` into its own SettingsError; the message already names the setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from functions.core.notify import FilterError, NoticeFilter, TemplateError, WebhookTemplate
from functions.notify.webhook import WebhookUrlError, check_url

WEBHOOK_URL = "MBRIDGE_WEBHOOK_URL"
WEBHOOK_TEMPLATE = "MBRIDGE_WEBHOOK_TEMPLATE"
WEBHOOK_ACTIONS = "MBRIDGE_WEBHOOK_ACTIONS"


class WebhookConfigError(ValueError):
    """A webhook setting that is wrong; the message starts with the setting's name."""


@dataclass(frozen=True)
class WebhookConfig:
    """Where notices go, what they look like, and which audit records make one."""

    url: str = field(repr=False)  # a secret: the key is in its path
    template: WebhookTemplate
    notice_filter: NoticeFilter


def webhook_config(url: str | None, template: str | None, actions: str | None) -> WebhookConfig | None:
    """The webhook the settings give, or None when `url` is unset (no notices).

    The template and the filter are checked even then: a half-removed configuration is named, not
    ignored.

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
    if not url:
        set_alone = [name for name, value in ((WEBHOOK_TEMPLATE, template), (WEBHOOK_ACTIONS, actions)) if value]
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
    return WebhookConfig(checked, parsed_template, notice_filter)
