"""How large an input the function core takes on, and how much of a text from outside it keeps.

The names and ids an action needs are bounded where commands are made (wire/commands.py:
`MAX_TARGET_LENGTH`, `MAX_EVENT_ID_LENGTH`); `process` checks an event against them, and against
the bounds below, before it does anything for it.

Standard library only: the agent's Python 3.9 may import this module.
"""

from __future__ import annotations

# A message body larger than this is refused as malformed: a Service Bus message (standard tier)
# holds no more, and a real envelope is a few KiB (one listing 1,000 VMs, twice, about 170 KiB).
# It also bounds what a store keeps of an event waiting for its pool's budget.
MAX_ENVELOPE_BYTES = 256 * 1024
# What the agent leaves of that for the proof of its identity, added when the message goes out
# (an Azure attested document is about 5 KiB of base64, a GCE identity token about 1 KiB).
PROOF_ROOM_BYTES = 16 * 1024

# At most this many VMs in one event's `resources`: a scale set holds at most 1,000 VMs and an
# availability set 200, and an event lists the VMs of one update domain at most.
MAX_RESOURCES = 1000

# The most characters of one text an audit record or a log line keeps: an envelope's description,
# an error message quoting what it refused, or a load balancer's answer may be any size.
MAX_AUDIT_TEXT = 2048
# The VMs of an event named in each of its audit records; the others are counted. Every record of
# an event carries them, so a 1,000-VM event would otherwise write its list a thousand times.
AUDIT_RESOURCES = 20


def bounded(text: str, limit: int = MAX_AUDIT_TEXT) -> str:
    """`text`, or its first characters and a marker saying how many were cut, in `limit` characters."""
    if len(text) <= limit:
        return text
    # The count in the marker has no more digits than len(text): the result fits in `limit`.
    kept = limit - len(_cut_marker(len(text)))
    return text[:kept] + _cut_marker(len(text) - kept)


def _cut_marker(cut: int) -> str:
    return f" …[{cut} more characters cut]"
