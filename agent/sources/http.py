"""HTTP to the metadata service, and nowhere else.

- Redirects are never followed and proxies from the environment are never used: the
  metadata headers must only ever reach the link-local metadata endpoint
  (docs/agent.md#what-it-does-and-why-you-can-trust-it).
- Every failure becomes a `MetadataUnavailableError` with a `kind` used in metrics and
  logs; callers back off and retry. 404 is an answer (absent key), not a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Callable, Union

import requests

from agent.timing import RateLimiter
from wire.errors import RetryableError

LOGGER = logging.getLogger("mbridge.metadata")

Timeout = Union[float, tuple[float, float]]

# (connect, read) seconds. The link-local endpoint answers in milliseconds when healthy.
DEFAULT_TIMEOUT: tuple[float, float] = (2.0, 10.0)


class MetadataUnavailableError(RetryableError):
    """The metadata service did not give a usable answer; retry after a backoff.

    `kind` is one of: rate_limited, server_error, client_error, timeout, connection,
    redirect, malformed.
    """

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


class MetadataHttp:
    """A small client for one metadata base URL (e.g. http://169.254.169.254)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        limiter: RateLimiter | None = None,
        session_factory: Callable[[], requests.Session] = requests.Session,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        self._limiter = limiter
        self._session = session_factory()
        # Never take HTTP(S)_PROXY or .netrc from the environment: metadata requests go
        # straight to the link-local address, and the headers go nowhere else.
        self._session.trust_env = False

    def get(
        self, path: str, params: Mapping[str, str] | None = None, timeout: Timeout = DEFAULT_TIMEOUT
    ) -> requests.Response:
        return self._send("GET", path, params, None, timeout)

    def post(
        self,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> requests.Response:
        return self._send("POST", path, params, body, timeout)

    def close(self) -> None:
        self._session.close()

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        timeout: Timeout,
    ) -> requests.Response:
        if self._limiter is not None:
            self._limiter.acquire()
        url = self.base_url + path
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = self._session.request(
                method,
                url,
                params=params,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except requests.Timeout as exc:
            raise MetadataUnavailableError("timeout", f"{method} {path}: no answer in time ({exc})") from exc
        except requests.ConnectionError as exc:
            raise MetadataUnavailableError(
                "connection", f"{method} {path}: cannot reach the metadata service at {self.base_url} ({exc})"
            ) from exc
        except requests.RequestException as exc:
            raise MetadataUnavailableError("connection", f"{method} {path}: {exc}") from exc
        status = response.status_code
        if 300 <= status < 400:
            raise MetadataUnavailableError(
                "redirect",
                f"{method} {path}: answered {status} to {response.headers.get('Location')!r}; "
                "redirects are never followed (metadata headers stay on the metadata endpoint)",
                status,
            )
        if status == 429:
            raise MetadataUnavailableError("rate_limited", f"{method} {path}: 429 Too Many Requests", status)
        if status >= 500:
            raise MetadataUnavailableError("server_error", f"{method} {path}: {status} {_snippet(response)}", status)
        return response


def _snippet(response: requests.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:200]
