"""The sources by cloud: the only place that knows every cloud the agent runs on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

from agent.config import AgentSettings
from agent.sources.azure.source import AzureSource
from agent.sources.base import Source
from agent.sources.gce.source import GceSource
from wire.model import Cloud

SOURCES: Mapping[Cloud, Callable[[AgentSettings], Source]] = {Cloud.AZURE: AzureSource, Cloud.GCE: GceSource}


def open_source(settings: AgentSettings) -> Source:
    return SOURCES[settings.cloud](settings)
