"""The testing kit: one fake per port, shared by every test folder.

- `FakeClock`: every clock the code takes (agent.timing.Clock, a wall clock, a monotonic clock, a sleep)
- `RecordingSender`: the CommandSender port
- `FakeBalancer`: the LoadBalancer port (pools in memory, the local pool's contract)
- `RecordingReadiness`: the agent's readiness
- `RecordingWebhook`: the webhook port of the notifier (functions/notify/webhook.py)
- `Killed`: a crash (a BaseException) for a hook to raise where an invocation dies

A fake fails, slows or crashes where a test says through its hooks (`fail`, `on`), instead of a
copy of it written for that test.
"""

from tests.kit.balancer import FakeBalancer
from tests.kit.clock import FakeClock
from tests.kit.commands import RecordingSender
from tests.kit.crash import Killed
from tests.kit.readiness import RecordingReadiness
from tests.kit.webhook import RecordingWebhook

__all__ = ["FakeBalancer", "FakeClock", "Killed", "RecordingReadiness", "RecordingSender", "RecordingWebhook"]
