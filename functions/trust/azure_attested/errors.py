"""The errors of attested-document verification.

Every step raises them, and the verifiers tell a fetch failure (which a retry may cure) from any
other refusal, so they stand apart from each step.
"""

from __future__ import annotations


class AttestationError(ValueError):
    """The attested document is not valid proof; the message says what failed and what to check."""


class IssuerFetchError(AttestationError):
    """The signer's issuing CA could not be fetched from its caIssuers URL (a retry may succeed)."""
