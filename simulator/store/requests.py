"""What the simulator's HTTP layer and its API modules exchange: a request, an answer, and the errors
that become HTTP statuses.

Every API module (Azure, GCE, control, faults) speaks these types and nothing else of the store, so
they live apart from the state they serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Cloud(str, Enum):
    AZURE = "azure"
    GCE = "gce"


class RequestError(Exception):
    """A request the simulator refuses; `status` is the HTTP status the control API answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class FieldError(RequestError):
    """One field of a control-API body or scenario step is wrong; the message names the field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(400, f"field '{field_name}': {message}")
        self.field = field_name
        self.reason = message


@dataclass(frozen=True)
class MetadataRequest:
    """One HTTP request as the API modules see it; header names are lowercased."""

    method: str
    path: str
    query: Mapping[str, str]  # first value of each parameter
    headers: Mapping[str, str]
    body: bytes
    vm: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Response:
    """What a handler answers; the HTTP layer writes it.

    `broken` is this answer's malformed variant (what the `malformed` fault sends instead); only
    document-carrying 200 answers have one, and the API module that knows the format makes it.
    """

    status: int
    body: bytes = b""
    content_type: str = "application/json; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    broken: bytes | None = None
