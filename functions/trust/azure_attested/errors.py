"""The errors of attested-document verification.

Every step raises them, and the verifiers tell a fetch failure (which a retry may cure) from any
other refusal, so they stand apart from each step.
"""

from __future__ import annotations


class AttestationError(ValueError):
    """The attested document is not valid proof; the message says what failed and what to check."""


class DocumentExpiredError(AttestationError):
    """The attested document had expired at the moment it had to be valid at."""


class IssuerFetchError(AttestationError):
    """The signer's issuing CA could not be fetched from its caIssuers URL (a retry may succeed)."""


class IssuerNotServedError(Exception):
    """What a `fetch_issuer` raises when the URL answered, and not with a certificate: an HTTP 4xx
    (or 3xx, not followed), a body larger than a certificate. Unlike a network error or a 5xx, that
    is an answer asking again will not change, so the document is refused, not retried."""
