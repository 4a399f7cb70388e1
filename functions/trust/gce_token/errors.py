"""The two ways a token check ends without an identity: a refusal, or certificates not to be had now.

The verifiers turn the first into a refused message and the second into a retry, so every module of
the check raises these.
"""

from __future__ import annotations

from wire.errors import RetryableError


class TokenError(ValueError):
    """The token is refused: the message says what failed and what to check."""


class TokenExpiredError(TokenError):
    """The token had expired when the message was accepted."""


class CertsUnavailableError(RetryableError):
    """The certificates to verify against could not be had now; retry later, do not refuse."""
