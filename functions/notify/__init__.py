"""Notices to people: the webhook adapter of `functions.core.notify`'s Notifier port.

Apps call `notifying_audit` in their wiring: the audit log they built, wrapped so that the records
the settings name are also posted to the webhook (docs/operations.md, "Notifications").
"""

from __future__ import annotations

from functions.core.notify import NotifyingAuditLog
from functions.core.ports import AuditLog
from functions.notify.config import (
    WEBHOOK_ACTIONS,
    WEBHOOK_TEMPLATE,
    WEBHOOK_URL,
    WebhookConfig,
    WebhookConfigError,
    webhook_config,
)
from functions.notify.webhook import RetryBounds, WebhookClient, WebhookNotifier, check_url

__all__ = [
    "WEBHOOK_ACTIONS",
    "WEBHOOK_TEMPLATE",
    "WEBHOOK_URL",
    "RetryBounds",
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
    """
    if config is None:
        return audit
    notifier = WebhookNotifier(WebhookClient(config.url, bounds))
    return NotifyingAuditLog(audit, notifier, config.template, config.notice_filter, cloud=cloud)
