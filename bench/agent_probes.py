"""Small measurements that explain the agent's footprint, each in a fresh child process.

- `start_import_rss` / `import_rss`: the resident memory of an interpreter that only imports what the agent imports for
  a transport (nothing runs): how much of the agent's RSS is its code and libraries.
- `start_empty_pull` / `empty_pull`: how long the agent's own Pub/Sub command pull, with the 1 s wait its command
  loop uses, takes when there is no command: how often an idle agent pulls.

Each probe is a short program run with `python -c`, so the benchmark's own process (which serves
the simulator) never loads the agent's libraries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.agent_process import clean_environment
from bench.results import ROOT

PROBE_TIMEOUT = 60.0
# The agent's modules for every transport, then the transport's own (agent/main.py imports it lazily).
AGENT_MODULES = ("mbridge.cli", "agent.main")
TRANSPORT_MODULES: Mapping[str, tuple[str, ...]] = {
    "jsonl": ("wire.transports.jsonl",),
    "local": ("wire.transports.local", "agent.commands"),
    "pubsub": ("wire.transports.pubsub", "agent.commands"),
    "servicebus": ("wire.transports.servicebus", "agent.commands"),
}
# What every agent loads, in the order the agent loads it: its state (SQLite), then HTTP to the metadata
# service (the standard library's http.client, which loads ssl and email). A bus's SDK brings its own
# HTTP (requests, urllib3) with the transport's step.
STATE_MODULES = ("sqlite3",)
HTTP_MODULES = ("http.client",)
# The cryptography library, loaded at the first message of an Azure agent (the proof of identity signs
# each message with an Ed25519 key) or the first command of an agent with a --verify-key: an idle agent
# has not loaded it, and this step says what it adds once it has.
CRYPTO_MODULES = ("cryptography.hazmat.primitives.asymmetric.ed25519", "cryptography.hazmat.primitives.serialization")

_IMPORT_RSS = """
import importlib, json, sys
from agent.lean import leave_out_unused_modules
leave_out_unused_modules()  # as `mbridge agent` does first
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
steps = [("interpreter", rss())]
for group in json.loads(sys.argv[1]):
    for name in group:
        importlib.import_module(name)
    steps.append((",".join(group), rss()))
print(json.dumps(steps))
"""

_EMPTY_PULL = """
import json, sys, time
from wire.transports.pubsub import PubSubSettings, build_agent_transport
transport = build_agent_transport(PubSubSettings(project=sys.argv[1], vm_name=sys.argv[2]))
receiver = transport.commands
took = []
for _ in range(int(sys.argv[3])):
    started = time.monotonic()
    receiver.receive_commands(float(sys.argv[4]))
    took.append((time.monotonic() - started) * 1000)
transport.close()
print(json.dumps(took))
"""


# The steps of the import table, in the order of the probe's groups.
IMPORT_STEPS = ("interpreter", "sqlite3", "http", "agent", "cryptography")


@dataclass(frozen=True)
class ImportRss:
    """Resident MB after each step: a bare interpreter, then each group of imports added to it."""

    after: dict[str, float]

    def cost(self, step: str) -> float:
        """What `step` added (MB); the interpreter's own size for the first."""
        index = IMPORT_STEPS.index(step)
        return self.after[step] - (self.after[IMPORT_STEPS[index - 1]] if index else 0.0)

    @property
    def idle_mb(self) -> float:
        """Everything an idle agent of the transport has imported (cryptography not yet)."""
        return self.after["agent"]

    def describe(self) -> str:
        return (
            f"an interpreter that only imports what this transport's agent imports has {self.idle_mb:.1f} MB "
            f"resident: the bare interpreter {self.cost('interpreter'):.1f}, sqlite3 {self.cost('sqlite3'):.1f}, "
            f"http.client with ssl {self.cost('http'):.1f}, the agent's modules and the transport's "
            f"{self.cost('agent'):.1f}; cryptography's Ed25519, loaded at the first command or the first message, "
            f"adds {self.cost('cryptography'):.1f} MB"
        )


def start_import_rss(transport: str) -> subprocess.Popen[str]:
    """Start the import probe for `transport` (collect it with `import_rss`)."""
    groups = [
        list(STATE_MODULES),
        list(HTTP_MODULES),
        [*AGENT_MODULES, *TRANSPORT_MODULES[transport]],
        list(CRYPTO_MODULES),
    ]
    return _start(_IMPORT_RSS, [json.dumps(groups)], {})


def import_rss(probe: subprocess.Popen[str]) -> ImportRss | None:
    output = _collect(probe)
    if output is None:
        return None
    steps = parse_import_steps(output)
    if len(steps) != len(IMPORT_STEPS):
        return None
    return ImportRss(dict(zip(IMPORT_STEPS, steps)))


def parse_import_steps(output: str) -> list[float]:
    """The RSS (MB) after each step of the import probe's JSON output, the bare interpreter first."""
    steps = json.loads(output)
    if not isinstance(steps, list) or len(steps) < 3:
        raise ValueError(f"the import probe printed {output!r}, not its steps")
    return [float(rss) for _, rss in steps]


def start_empty_pull(
    emulator_host: str, project: str, vm_name: str, *, wait: float, pulls: int
) -> subprocess.Popen[str]:
    """Start `pulls` command pulls with `wait` on `vm_name`'s empty commands subscription (see `empty_pull`)."""
    arguments = [project, vm_name, str(pulls), str(wait)]
    return _start(_EMPTY_PULL, arguments, {"PUBSUB_EMULATOR_HOST": emulator_host})


def empty_pull(probe: subprocess.Popen[str]) -> list[float] | None:
    """How long each pull took (ms); None when the probe failed."""
    output = _collect(probe)
    return None if output is None else [float(ms) for ms in json.loads(output)]


def _start(code: str, arguments: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 - our own probe code
        [sys.executable, "-c", code, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_environment(env),
    )


def _collect(probe: subprocess.Popen[str]) -> str | None:
    try:
        out, _ = probe.communicate(timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return None
    lines = out.strip().splitlines()
    return lines[-1] if probe.returncode == 0 and lines else None
