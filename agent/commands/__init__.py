"""Commands addressed to this VM: check them, remember them, execute them at most once.

See docs/contracts.md#what-the-agent-checks. The agent must never approve what it should not, so
every command passes, in order:

1. decoding (strict; a malformed command is rejected under a derived id),
2. the target (a command for another VM is ignored, never answered: the Pub/Sub emulator does not
   apply subscription filters, so agents see each other's commands, and an answer from the wrong
   VM would put a false "rejected" on the channel),
3. the signature, when a verification key is configured,
4. replay (the ledger knows every command_id it accepted for processing),
5. expiry, and `execute_at` (the command is held in the ledger until then).

Execution records "executing" in the ledger before any side effect, and the final result (with the
content digest) before the result is returned for publishing. A redelivered command therefore gets
the stored result back with the same id, and nothing runs twice. An approval re-validates against
a fresh Scheduled Events document at execution time and POSTs once.

The ledger is one SQLite file (WAL) owned by the caller's state directory.

- `processor`: the checks on receipt, holding, and when a command runs
- `execution`: what a due command does (drain, restore, an approval re-validated against IMDS)
- `ledger`: the SQLite ledger (replay, held commands, results not yet published)
- `ports`: what the processor needs from the agent (readiness, the Scheduled Events client)
- `results`: the accepted / rejected results both answer with
"""

from __future__ import annotations

from agent.commands.execution import CommandExecutor
from agent.commands.ledger import (
    DEFAULT_RETENTION,
    LEDGER_SCHEMA_VERSION,
    SCHEMA,
    CommandLedger,
    EntryState,
    LedgerEntry,
    LedgerError,
)
from agent.commands.ports import Approver, CommandRetryableError, Readiness
from agent.commands.processor import (
    IGNORED_OTHER_TARGET,
    PRUNE_INTERVAL,
    RETRY_DELAY,
    UNKNOWN_EVENT,
    CommandProcessor,
)

__all__ = [
    "DEFAULT_RETENTION",
    "IGNORED_OTHER_TARGET",
    "LEDGER_SCHEMA_VERSION",
    "PRUNE_INTERVAL",
    "RETRY_DELAY",
    "SCHEMA",
    "UNKNOWN_EVENT",
    "Approver",
    "CommandExecutor",
    "CommandLedger",
    "CommandProcessor",
    "CommandRetryableError",
    "EntryState",
    "LedgerEntry",
    "LedgerError",
    "Readiness",
]
