"""Step 6: what the signed JSON says (vmId, subscriptionId, nonce, timeStamp), and whether it is
valid at the moment asked about.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from functions.trust.azure_attested.errors import AttestationError, DocumentExpiredError

CLOCK_SKEW = timedelta(minutes=5)  # how far a VM's clock may run ahead of the verifier's
TIMESTAMP_FORMAT = "%m/%d/%y %H:%M:%S %z"  # "11/30/20 21:19:19 -0000"


@dataclass(frozen=True)
class AttestedDocument:
    """What a verified document says, and who signed it."""

    vm_id: str
    subscription_id: str
    nonce: str
    created_on: datetime  # UTC
    expires_on: datetime  # UTC
    signer: str  # the signer certificate's DNS name that matched `signer_names`
    content: dict[str, Any]  # the whole signed JSON


def read_content(content: bytes, signer: str, valid_at: datetime) -> AttestedDocument:
    try:
        document = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AttestationError(f"the signed content is not JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise AttestationError("the signed content is not a JSON object")
    vm_id = document.get("vmId")
    subscription_id = document.get("subscriptionId")
    nonce = document.get("nonce")
    if not isinstance(vm_id, str) or not vm_id:
        raise AttestationError("the signed content has no vmId")
    if not isinstance(subscription_id, str) or not subscription_id:
        raise AttestationError(
            "the signed content has no subscriptionId; request the document with api-version 2019-04-30 or later"
        )
    if not isinstance(nonce, str):
        raise AttestationError("the signed content has no nonce")
    stamp = document.get("timeStamp")
    if not isinstance(stamp, dict):
        raise AttestationError("the signed content has no timeStamp")
    created_on = _timestamp(stamp, "createdOn")
    expires_on = _timestamp(stamp, "expiresOn")
    if expires_on < created_on:
        raise AttestationError(f"the document expires ({expires_on}) before it was created ({created_on})")
    if valid_at < created_on - CLOCK_SKEW:
        raise AttestationError(
            f"the document was created at {created_on.isoformat()}, after {valid_at.isoformat()} "
            f"(more than {CLOCK_SKEW} of clock skew): check the clocks"
        )
    if valid_at > expires_on:
        raise DocumentExpiredError(
            f"the document expired at {expires_on.isoformat()}, before {valid_at.isoformat()}: fetch a new one"
        )
    return AttestedDocument(
        vm_id=vm_id,
        subscription_id=subscription_id,
        nonce=nonce,
        created_on=created_on,
        expires_on=expires_on,
        signer=signer,
        content=document,
    )


def _timestamp(stamp: dict[str, Any], key: str) -> datetime:
    value = stamp.get(key)
    if not isinstance(value, str):
        raise AttestationError(f"the signed content has no timeStamp.{key}")
    try:
        return datetime.strptime(value, TIMESTAMP_FORMAT).astimezone(timezone.utc)
    except ValueError as exc:
        raise AttestationError(
            f"timeStamp.{key} {value!r} is not in IMDS's format MM/DD/YY HH:MM:SS -0000 ({exc})"
        ) from exc
