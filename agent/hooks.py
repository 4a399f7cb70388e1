"""A local command run on each change of this VM's maintenance (docs/operations.md, "Notifications").

The operator gives a command line (`--hook-command`); it is split like a shell would split it
(shlex) and run directly, never through a shell: a script is run by its own `#!` line. It gets the
agent's environment, less the agent's own `MBRIDGE_*` settings (some are secrets), plus the event
as `MBRIDGE_EVENT_*` variables and the whole event as JSON in `MBRIDGE_EVENT_JSON`.

A hook must never hold up the agent: `HookRunner.notify` puts the change in a small queue and
returns; one worker thread runs the hooks in order, each for at most `timeout` seconds, after which
its whole process group is killed. When the queue is full the oldest change waiting is dropped.
Every run is logged (exit code, duration, timeout) and counted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from agent.hook_command import DEFAULT_TIMEOUT
from agent.logs import event_fields
from wire.background import DropOldestWorker, DropReason
from wire.envelope import event_to_data
from wire.model import MaintenanceEvent
from wire.timefmt import format_rfc3339

LOGGER = logging.getLogger("mbridge.agent.hooks")

# Changes waiting for the worker: a VM sees a handful per event, so this is only reached when
# hooks hang; the oldest waiting change is then dropped, and counted.
DEFAULT_CAPACITY = 16
# What of a hook's output (stdout and stderr together) is logged: its end, where errors are.
OUTPUT_TAIL_BYTES = 2048
_OUTPUT_CHUNK_BYTES = 64 * 1024
# How long the end of a hook's output is waited for once it ended: a process it left running (`cmd &`)
# keeps the output open, and is read on (so that it never blocks on a full pipe) but not waited for.
OUTPUT_GRACE_SECONDS = 0.5
# MBRIDGE_EVENT_JSON stays under the kernel's limit on one environment string (128 KiB on Linux):
# past this, the cloud's raw entry is left out of it.
MAX_EVENT_JSON_CHARS = 64 * 1024
# The agent's own settings: not passed on to the hook.
_AGENT_PREFIX = "MBRIDGE_"

METRIC_RUNS = "mbridge_hook_runs_total"
METRIC_DROPPED = "mbridge_hook_dropped_total"
METRIC_DURATION = "mbridge_hook_duration_seconds"
RESULTS = ("ok", "failed", "timeout", "error")


class HookMetrics(Protocol):
    """What the runner records into (agent.health.metrics.Metrics has both)."""

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None: ...

    def observe(self, name: str, value: float) -> None: ...


@dataclass(frozen=True)
class HookRun:
    """How one run of the hook went."""

    event_id: str
    status: str
    result: str  # ok | failed (exit code not 0) | timeout (killed) | error (could not be started)
    exit_code: int | None
    seconds: float
    output: str  # the end of what it printed


def event_environment(event: MaintenanceEvent) -> dict[str, str]:
    """The MBRIDGE_EVENT_* variables of one change; a field that is not known is not set."""
    variables = {
        "MBRIDGE_EVENT_ID": event.event_id,
        "MBRIDGE_EVENT_KIND": event.kind.value,
        "MBRIDGE_EVENT_TYPE": _cloud_type(event),
        "MBRIDGE_EVENT_STATUS": event.status.value,
        "MBRIDGE_EVENT_VM": event.reporter,
        "MBRIDGE_EVENT_CLOUD": event.cloud.value,
        "MBRIDGE_EVENT_RESOURCES": ",".join(event.resources),
        "MBRIDGE_EVENT_JSON": _event_json(event),
    }
    if event.not_before is not None:
        variables["MBRIDGE_EVENT_NOT_BEFORE"] = format_rfc3339(event.not_before)
    if event.event_source is not None:
        variables["MBRIDGE_EVENT_SOURCE"] = event.event_source.value
    if event.duration_seconds is not None and event.duration_seconds >= 0:  # Azure's -1: not known
        variables["MBRIDGE_EVENT_DURATION_SECONDS"] = str(event.duration_seconds)
    return variables


def _cloud_type(event: MaintenanceEvent) -> str:
    """The cloud's own name of the event: Azure's EventType, GCE's metadata value; else the kind."""
    raw = event.raw
    for value in (raw.get("EventType"), raw.get("value")):
        if isinstance(value, str) and value:
            return value
    return event.kind.value


def _event_json(event: MaintenanceEvent) -> str:
    data = event_to_data(event)
    text = json.dumps(data, ensure_ascii=False, sort_keys=True)
    if len(text) > MAX_EVENT_JSON_CHARS:
        data["raw"] = {"omitted": "too large for an environment variable"}
        text = json.dumps(data, ensure_ascii=False, sort_keys=True)
    return text


class HookRunner:
    """Runs the hook command for each change it is told of, one at a time, on its own thread."""

    def __init__(
        self,
        argv: Sequence[str],
        timeout: float = DEFAULT_TIMEOUT,
        *,
        capacity: int = DEFAULT_CAPACITY,
        metrics: HookMetrics | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = list(argv)
        self._timeout = timeout
        self._metrics = metrics
        base = os.environ if environ is None else environ
        self._environ = {name: value for name, value in base.items() if not name.startswith(_AGENT_PREFIX)}
        self._worker: DropOldestWorker[MaintenanceEvent] = DropOldestWorker(
            self._run_and_record, capacity=capacity, on_drop=self._drop, name="hooks"
        )
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((*RESULTS, "dropped"), 0)

    def notify(self, event: MaintenanceEvent) -> None:
        """Run the hook for this change of this VM's maintenance, soon; returns at once."""
        self._worker.put(event)

    def counts(self) -> dict[str, int]:
        """Runs by result (ok, failed, timeout, error), and changes dropped."""
        with self._lock:
            return dict(self._counts)

    def settle(self, timeout: float) -> bool:
        """Wait until no change is waiting or running; False when `timeout` ran out first."""
        return self._worker.settle(timeout)

    def close(self, timeout: float = 0.0) -> None:
        """Take no more changes; give those waiting up to `timeout` seconds, then stop the worker
        (a hook still running is left to its own timeout)."""
        self._worker.close(timeout)

    def _drop(self, event: MaintenanceEvent, reason: DropReason) -> None:
        why = f"{self._worker.capacity} changes were waiting" if reason == "full" else "the agent is stopping"
        with self._lock:
            self._counts["dropped"] += 1
        if self._metrics is not None:
            self._metrics.inc(METRIC_DROPPED)
        LOGGER.warning(
            "hook not run for %s %s %s: %s",
            event.kind.value,
            event.event_id,
            event.status.value,
            why,
            extra=event_fields(event, result="dropped"),
        )

    def _run_and_record(self, event: MaintenanceEvent) -> None:
        try:
            run = self.run(event)
        except Exception:  # still a run: counted and logged as an error, like one that could not start
            LOGGER.exception("the hook for %s could not be run", event.event_id, extra=event_fields(event))
            run = HookRun(event.event_id, event.status.value, "error", None, 0.0, "")
        self._record(run, event)

    def run(self, event: MaintenanceEvent) -> HookRun:
        """Run the hook for one change, now, on this thread, and return how it went."""
        environment = {**self._environ, **event_environment(event)}
        start = time.monotonic()
        try:
            process = subprocess.Popen(  # noqa: S603 - argv from the operator's own setting, no shell
                self._argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=environment,
                close_fds=True,
                **_own_group(),
            )
        except OSError as error:
            return HookRun(event.event_id, event.status.value, "error", None, 0.0, str(error))
        assert process.stdout is not None  # stdout=PIPE
        output = _OutputTail(process.stdout)
        try:
            code: int | None = process.wait(timeout=self._timeout)
            result = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
            code, result = None, "timeout"
        seconds = time.monotonic() - start
        return HookRun(event.event_id, event.status.value, result, code, seconds, output.text(OUTPUT_GRACE_SECONDS))

    def _record(self, run: HookRun, event: MaintenanceEvent) -> None:
        # Its lines carry the event's fields, as every line about an event does: one query by
        # event id finds the hook's runs beside what the agent published.
        extra = event_fields(event, result=run.result)
        with self._lock:
            self._counts[run.result] += 1
        if self._metrics is not None:
            self._metrics.inc(METRIC_RUNS, result=run.result)
            self._metrics.observe(METRIC_DURATION, run.seconds)
        if run.result == "ok":
            LOGGER.info("hook for %s %s: exit 0 in %.2f s", run.event_id, run.status, run.seconds, extra=extra)
            return
        what = {
            "failed": f"exit {run.exit_code}",
            "timeout": f"killed after the {self._timeout:g} s timeout",
            "error": "could not be started",
        }[run.result]
        LOGGER.warning(
            "hook for %s %s: %s in %.2f s%s",
            run.event_id,
            run.status,
            what,
            run.seconds,
            f"; its output ends: {run.output}" if run.output else "",
            extra=extra,
        )


def _own_group() -> dict[str, Any]:
    """Start the hook in a process group of its own, so that a timeout kills what it started too."""
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined,unused-ignore]
    return {"start_new_session": True}


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if os.name == "nt":
        process.kill()
        return
    # Its own session: the group id is its pid. ProcessLookupError: the whole group ended meanwhile.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


class _OutputTail:
    """Reads the hook's output to its end on a thread of its own, keeping only its last
    OUTPUT_TAIL_BYTES: a hook that prints without end for its whole timeout costs that much memory,
    not a file that grows with it. (A pipe the hook fills would stop it: it is read all along.)"""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="hook-output", daemon=True)
        self._thread.start()

    def text(self, wait: float) -> str:
        """What was read of the end, once the output ended or after `wait` seconds."""
        self._thread.join(wait)
        with self._lock:
            return bytes(self._tail).decode("utf-8", errors="replace").strip()

    def _read(self) -> None:
        with self._pipe:
            while True:
                chunk = os.read(self._pipe.fileno(), _OUTPUT_CHUNK_BYTES)
                if not chunk:
                    return
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-OUTPUT_TAIL_BYTES]
