"""How large an input the function core takes on.

The names and ids an action needs are bounded where commands are made (functions/core/commands.py:
`MAX_TARGET_LENGTH`, `MAX_EVENT_ID_LENGTH`); `process` checks an event against them, and against
the bounds below, before it does anything for it.

Standard library only: the agent's Python 3.9 may import this module.
"""

from __future__ import annotations

# A message body larger than this is refused as malformed: a Service Bus message (standard tier)
# holds no more, and a real envelope is a few KiB (one listing 1,000 VMs, twice, about 170 KiB).
# It also bounds what a store keeps of an event waiting for its pool's budget.
MAX_ENVELOPE_BYTES = 256 * 1024

# At most this many VMs in one event's `resources`: a scale set holds at most 1,000 VMs and an
# availability set 200, and an event lists the VMs of one update domain at most.
MAX_RESOURCES = 1000
