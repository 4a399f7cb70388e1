"""Notices to people: the webhook adapter of `functions.core.notify`'s Notifier port.

Apps call `notifying_audit` in their wiring: the audit log they built, wrapped so that the records
the settings name are also posted to the webhook (docs/operations.md, "Notifications").
"""

from __future__ import annotations

from collections.abc import Sequence

from functions.core.notify import Notice, NotifyingAuditLog, digest_notice
from functions.core.ports import AuditLog
from functions.notify.config import (
    WEBHOOK_ACTIONS,
    WEBHOOK_SUMMARY_SECONDS,
    WEBHOOK_TEMPLATE,
    WEBHOOK_URL,
    WebhookConfig,
    WebhookConfigError,
    webhook_config,
)
from functions.notify.notifier import WebhookNotifier
from functions.notify.wake_up import SummaryWakeUp
from functions.notify.webhook import RetryBounds, WebhookClient, check_url

__all__ = [
    "WEBHOOK_ACTIONS",
    "WEBHOOK_SUMMARY_SECONDS",
    "WEBHOOK_TEMPLATE",
    "WEBHOOK_URL",
    "RetryBounds",
    "SummaryWakeUp",
    "WebhookClient",
    "WebhookConfig",
    "WebhookConfigError",
    "WebhookNotifier",
    "check_url",
    "notifying_audit",
    "webhook_config",
]


def notifying_audit(
    audit: AuditLog, config: WebhookConfig | None, *, cloud: str = "", bounds: RetryBounds | None = None
) -> AuditLog:
    """`audit`, announcing on the webhook what `config` names; `audit` itself when there is no webhook.

    `cloud` fills ${cloud} where a record does not say (command results, malformed messages).
    Refused reports are summarised at most once per `config.summary_seconds`; a timer sends a
    summary that falls due while no record comes.
    """
    if config is None:
        return audit
    template = config.template

    def digest(notices: Sequence[Notice]) -> Notice:
        return digest_notice(notices, template, cloud)

    notifier = WebhookNotifier(WebhookClient(config.url, bounds), digest=digest)
    wake_up = SummaryWakeUp()
    notifying = NotifyingAuditLog(
        audit,
        notifier,
        config.template,
        config.notice_filter,
        cloud=cloud,
        summary_seconds=config.summary_seconds,
        on_held=wake_up.schedule,
    )
    wake_up.target = notifying.summarise_due
    return notifying
