"""`mbridge agent --check`: every start-up check, one line each, in the order the start meets them
(docs/agent.md). Loaded only for --check: a running agent carries none of it."""

from __future__ import annotations

import errno
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TextIO, TypeVar

from agent.config import AgentSettings, ConfigError
from agent.main import (
    AGENT_DB,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_PROBLEM,
    LEDGER_DB,
    build_prover,
    build_transport_checked,
    import_otel,
    import_transport,
    load_verify_key,
)
from agent.proofs import ProofRefusedError, ProofUnavailableError
from agent.sources.base import Source
from agent.sources.http import MetadataUnavailableError
from agent.sources.registry import open_source
from agent.state import SCHEMA as AGENT_SCHEMA
from agent.state_files import StateDirError, StateUnavailableError, ensure_state_dir, state_dir_problems
from agent.timing import SystemClock
from wire.transports.base import TransportConfigError, TransportUnavailableError
from wire.version import version

T = TypeVar("T")

# The waits before asking the metadata service again after a 429, for the whole check: IMDS counts
# 5 requests a second per VM, from every process on it, so another process polling can take this
# check's turn for a moment. A running agent retries for ever; the check gives up within 7.5 s.
METADATA_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
STILL_NOT_READY = (
    "Until it answers, a running agent is not ready (/readyz 503) and mbridge_last_good_poll_timestamp_seconds is 0."
)


def check(settings: AgentSettings, out: TextIO, sleep: Callable[[float], None] = time.sleep) -> int:
    """Every start-up check, one line each: 0 all ok, 1 problems (worth retrying: the agent does),
    2 a configuration the agent refuses to start with. `sleep` waits between throttled reads."""
    worst = EXIT_OK
    patience = _Patience(sleep)

    def report(ok: bool, text: str, *, config: bool = False) -> None:
        nonlocal worst
        if not ok:
            worst = max(worst, EXIT_CONFIG if config else EXIT_PROBLEM)
        print(f"{'ok     ' if ok else 'PROBLEM'} {text}", file=out)

    report(True, "configuration: " + _describe(settings))
    _check_verify_key(settings, report)
    _check_state_dir(settings.state_dir, report)
    _check_listen(settings, report)
    try:
        report(True, import_transport(settings.transport))
        sdk = True
    except ConfigError as exc:
        report(False, str(exc), config=True)  # it starts with the setting: "transport (--transport / ...)"
        sdk = False
    _check_span_export(settings, report)
    source = open_source(settings)
    try:
        report(True, f"metadata service: {patience.read(source.describe_read)}")
    except MetadataUnavailableError as exc:
        report(False, f"metadata service at {settings.metadata_url}: {exc}. {metadata_hint(exc)} {STILL_NOT_READY}")
    try:
        name = patience.read(source.own_name)
        note = f" (overridden by --vm-name {settings.vm_name})" if settings.vm_name and settings.vm_name != name else ""
        report(True, f"this VM's name: {name}{note}")
    except MetadataUnavailableError as exc:
        if settings.vm_name:
            report(True, f"this VM's name: {settings.vm_name} (from --vm-name; metadata did not say: {exc})")
        else:
            report(False, f"this VM's name: {exc}; pass --vm-name NAME to set it")
    _check_proof(settings, source, report)
    _check_bus(settings, sdk, report)
    source.close()
    problems = "a configuration error" if worst == EXIT_CONFIG else "problem(s)"
    print("healthy" if worst == EXIT_OK else f"{problems}: see the PROBLEM lines above", file=out)
    return worst


class _Patience:
    """Reads of the metadata service, each asked again after a 429 while waits of
    METADATA_RETRY_DELAYS are left (shared by the check's reads, so it ends in seconds)."""

    def __init__(self, sleep: Callable[[float], None]) -> None:
        self._sleep = sleep
        self._delays: Iterator[float] = iter(METADATA_RETRY_DELAYS)

    def read(self, read: Callable[[], T]) -> T:
        while True:
            try:
                return read()
            except MetadataUnavailableError as exc:
                delay = next(self._delays, None) if exc.kind == "rate_limited" else None
                if delay is None:
                    raise
            self._sleep(delay)


def metadata_hint(exc: MetadataUnavailableError) -> str:
    """What to look at, for the way the metadata service failed."""
    if exc.kind == "rate_limited":
        return (
            f"It is throttling this VM (429, still after waits of {sum(METADATA_RETRY_DELAYS):g} s in all): "
            "IMDS allows 5 requests a second per VM, shared by every process on it; is something else polling it? "
            "A running agent backs off and retries."
        )
    if exc.kind in ("connection", "timeout"):
        return "Is this a VM of that cloud, and is the link-local address reachable (no proxy, no firewall rule)?"
    if exc.kind == "server_error":
        return "The metadata service is failing (a server error); a running agent backs off and retries."
    return f"Is --metadata-url this cloud's metadata service ({exc.kind})?"


def _describe(settings: AgentSettings) -> str:
    where = f"; file {settings.config_file}" if settings.config_file else ""
    return f"cloud {settings.cloud.value}, transport {settings.transport}, mbridge {version()}{where}"


def _check_verify_key(settings: AgentSettings, report: Callable[..., None]) -> None:
    if settings.transport == "jsonl":
        report(True, "verify key: not needed (jsonl takes no commands)")
        return
    if not settings.verify_key:
        report(True, "verify key: none; unsigned commands are executed (--insecure-unsigned-commands)")
        return
    try:
        load_verify_key(settings)
    except ConfigError as exc:
        report(False, str(exc), config=True)  # it starts with the setting: "verify key (--verify-key / ...)"
        return
    report(True, "verify key: an Ed25519 public key; only commands signed with its private key are executed")


def _check_listen(settings: AgentSettings, report: Callable[..., None]) -> None:
    """Bind the health address the way the health server will, and release it at once."""
    if settings.listen is None:
        report(True, "listen address: off (no /healthz, /readyz, /metrics)")
        return
    host, port = settings.listen
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        in_use = exc.errno == errno.EADDRINUSE
        running = _running_agent(host, port) if in_use else None
        if running is not None:
            # The agent being upgraded or reconfigured: the port is free once it stops.
            report(True, f"listen address {host}:{port}: held by a running mbridge agent ({running})")
            return
        # In use by something else may pass; an address this machine does not have, or a port
        # it may not use, will not.
        why = "in use, not by an mbridge agent" if in_use else exc.strerror or str(exc)
        report(
            False,
            f"listen address {host}:{port}: cannot be bound ({why}); choose another --listen (MBRIDGE_LISTEN) or 'off'",
            config=not in_use,
        )
        return
    report(True, f"listen address {host}:{port}: can be bound")


def _running_agent(host: str, port: int) -> str | None:
    """The release of the mbridge agent answering /healthz on host:port, or None when what
    listens there is not one."""
    # A wildcard address is reached on the loopback.
    target = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    connection = http.client.HTTPConnection(target, port, timeout=2.0)
    try:
        connection.request("GET", "/healthz")
        body = json.loads(connection.getresponse().read(65536))
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
    if not isinstance(body, dict) or "threads" not in body:
        return None
    return f"mbridge {body.get('version', 'unknown')}"


def _check_bus(settings: AgentSettings, sdk: bool, report: Callable[..., None]) -> None:
    """Ask the bus what the agent will do there, with its credentials."""
    if not sdk:
        report(False, f"bus: not tried, transport {settings.transport} cannot be loaded (above)", config=True)
        return
    try:
        transport = build_transport_checked(settings, settings.vm_name or "unknown-vm")
    except ConfigError as exc:  # the settings themselves: retrying cannot help
        report(False, f"bus: {exc}", config=True)
        return
    try:
        report(True, f"bus: {transport.check()}")
    except (TransportConfigError, TransportUnavailableError) as exc:
        # What the bus answered (a role not granted yet, an entity missing, no network): it may pass.
        report(False, f"bus: transport {settings.transport}: {exc}")
    finally:
        transport.close()


def _check_proof(settings: AgentSettings, source: Source, report: Callable[..., None]) -> None:
    """Ask the metadata service for a proof of identity as the publisher will."""
    if settings.identity_proof == "none":
        report(True, "proof of identity: off (--identity-proof none); functions must use trust: reporter-name")
        return
    probe = b'{"specversion":"1.0","id":"check"}'
    try:
        proven = build_prover(settings, source, SystemClock()).prove(probe)
    except ProofUnavailableError as exc:
        when = "at once (a refusal, asked again every few minutes)" if isinstance(exc, ProofRefusedError) else ""
        report(
            False,
            f"proof of identity: {exc}. Messages will go without one{' ' + when if when else ''}, and functions "
            "with trust: attested will not act on them",
        )
        return
    what = source.proof_name
    report(True, f"proof of identity: the metadata service gives an {what} ({len(proven) - len(probe)} bytes)")


def _check_state_dir(state_dir: Path, report: Callable[..., None]) -> None:
    """Write a database in the state directory for real, and look at the agent's own files there."""
    from agent.commands import SCHEMA as LEDGER_SCHEMA

    try:
        ensure_state_dir(state_dir)
    except StateDirError as exc:
        # The start stops on it too (exit 2): a directory that cannot exist is the configuration's.
        report(False, f"state directory {state_dir}: {exc}", config=True)
        return
    except StateUnavailableError:
        pass  # transient (e.g. a full disk): state_dir_problems says it again, as a problem
    problems = state_dir_problems(state_dir, {AGENT_DB: AGENT_SCHEMA, LEDGER_DB: LEDGER_SCHEMA})
    for problem in problems:
        report(False, f"state directory {state_dir}: {problem}")
    if not problems:
        report(True, f"state directory {state_dir}: the agent can write its databases there")


def _check_span_export(settings: AgentSettings, report: Callable[..., None]) -> None:
    """Whether the spans can be exported (the collector itself is not asked: nothing is sent before a span)."""
    if settings.otlp_endpoint is None:
        return
    try:
        import_otel(settings)
    except ConfigError as exc:
        report(False, str(exc), config=True)  # it starts with the setting: "otlp endpoint (--otlp-endpoint / ...)"
        return
    report(True, f"span export: OpenTelemetry is importable; spans go to {settings.otlp_endpoint}/v1/traces")
