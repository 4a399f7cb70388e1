"""Error types shared by the agent and the functions.

`RetryableError` means "try again later" (the platform redelivers the message);
`PermanentError` means retrying cannot help (audit it, acknowledge it). Messages
say what is wrong and what to do about it.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base class of every error this project raises on purpose."""


class RetryableError(BridgeError):
    """A transient failure: the same input may succeed later."""


class PermanentError(BridgeError):
    """The input can never be processed as it is."""


class MalformedEnvelopeError(PermanentError):
    """A CloudEvent envelope that is not what docs/contracts.md#envelope defines."""


class MalformedDocumentError(PermanentError):
    """A metadata-service document (Azure IMDS or GCE value) that cannot be parsed."""
