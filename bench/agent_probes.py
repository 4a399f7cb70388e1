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
# The two biggest libraries every agent loads: HTTP to the metadata service, and the health endpoints.
HTTP_MODULES = ("requests", "http.server")
# Then the cryptography library: the Azure proof of identity signs each message with an Ed25519 key,
# and an agent with a --verify-key checks the commands' Ed25519 signatures.
CRYPTO_MODULES = ("cryptography.hazmat.primitives.asymmetric.ed25519", "cryptography.hazmat.primitives.serialization")

_IMPORT_RSS = """
import importlib, json, sys
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


@dataclass(frozen=True)
class ImportRss:
    interpreter_mb: float  # a bare interpreter
    http_mb: float  # after requests and http.server
    agent_mb: float  # after everything the agent imports for the transport
    crypto_mb: float | None = None  # after cryptography's Ed25519, imported after requests and http.server

    def describe(self) -> str:
        crypto = (
            ""
            if self.crypto_mb is None
            else f"; cryptography's Ed25519, for the proofs of identity and the commands' signatures, "
            f"{self.crypto_mb - self.http_mb:.1f} MB more"
        )
        return (
            f"an interpreter that only imports the agent's modules for this transport has {self.agent_mb:.1f} MB "
            f"resident (bare interpreter {self.interpreter_mb:.1f} MB; requests and http.server, for the metadata "
            f"service and the health endpoints, add {self.http_mb - self.interpreter_mb:.1f} MB{crypto})"
        )


def start_import_rss(transport: str) -> subprocess.Popen[str]:
    """Start the import probe for `transport` (collect it with `import_rss`)."""
    groups = [list(HTTP_MODULES), list(CRYPTO_MODULES), [*AGENT_MODULES, *TRANSPORT_MODULES[transport]]]
    return _start(_IMPORT_RSS, [json.dumps(groups)], {})


def import_rss(probe: subprocess.Popen[str]) -> ImportRss | None:
    output = _collect(probe)
    if output is None:
        return None
    steps = parse_import_steps(output)
    crypto = steps[2] if len(steps) > 3 else None
    return ImportRss(interpreter_mb=steps[0], http_mb=steps[1], agent_mb=steps[-1], crypto_mb=crypto)


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
