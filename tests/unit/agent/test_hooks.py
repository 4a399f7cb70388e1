"""The agent's hook command (agent/hooks.py), run for real: scripts written to tmp_path record what
they were given, sleep past their timeout, or fail."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.health.metrics import Metrics
from agent.hook_command import HookCommandError, parse_command
from agent.hooks import OUTPUT_TAIL_BYTES, HookRunner, _OutputTail
from tests.factories import azure_event
from tests.waiting import wait_until
from wire.envelope import event_to_data
from wire.model import EventKind, EventSource, EventStatus, MaintenanceEvent

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the scripts are POSIX scripts")

NOT_BEFORE = datetime(2026, 3, 1, 12, 15, tzinfo=timezone.utc)


def script(tmp_path: Path, name: str, body: str) -> Path:
    """An executable Python script with a #! line: run directly, as an operator's script is."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A hook that appends its argv and environment, as one JSON line, to the file its first argument names."""
    record = tmp_path / "runs.jsonl"
    path = script(
        tmp_path,
        "record env.py",  # a space in the path: the command is split as a shell would, not on blanks
        "with open(sys.argv[1], 'a') as out:\n"
        "    out.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')",
    )
    return path, record


def runs(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def reboot(event_id: str = "E-1", status: EventStatus = EventStatus.SCHEDULED, **fields: Any) -> MaintenanceEvent:
    values: dict[str, Any] = {
        "kind": EventKind.REBOOT,
        "event_id": event_id,
        "status": status,
        "reporter": "web-0",
        "resources": ("web-0", "web-1"),
        "not_before": NOT_BEFORE,
        "duration_seconds": 120,
        "event_source": EventSource.PLATFORM,
        "raw": {"EventId": event_id, "EventType": "Reboot"},
    }
    values.update(fields)
    return azure_event(**values)


def test_the_hook_gets_the_event_in_its_environment(tmp_path: Path) -> None:
    # GIVEN a hook command with a quoted script path and an argument with shell metacharacters
    path, record = recorder(tmp_path)
    argv = parse_command(f"'{path}' '{record}' 'a; touch {tmp_path}/pwned'")
    environ = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "MBRIDGE_SIGNING_KEY": "secret"}
    runner = HookRunner(argv, timeout=10.0, environ=environ)
    event = reboot()
    # WHEN it is told of a change
    runner.notify(event)
    assert runner.settle(10.0)
    # THEN it ran once, without a shell: the argument arrived as one word and ran nothing
    (run,) = runs(record)
    assert run["argv"] == [str(record), f"a; touch {tmp_path}/pwned"]
    assert not (tmp_path / "pwned").exists()
    # AND its environment holds the event, the agent's environment, but none of the agent's settings
    env = run["env"]
    assert {
        name: value for name, value in env.items() if name.startswith("MBRIDGE_EVENT_") and name != "MBRIDGE_EVENT_JSON"
    } == {
        "MBRIDGE_EVENT_ID": "E-1",
        "MBRIDGE_EVENT_KIND": "reboot",
        "MBRIDGE_EVENT_TYPE": "Reboot",
        "MBRIDGE_EVENT_STATUS": "scheduled",
        "MBRIDGE_EVENT_NOT_BEFORE": "2026-03-01T12:15:00Z",
        "MBRIDGE_EVENT_VM": "web-0",
        "MBRIDGE_EVENT_CLOUD": "azure",
        "MBRIDGE_EVENT_SOURCE": "platform",
        "MBRIDGE_EVENT_DURATION_SECONDS": "120",
        "MBRIDGE_EVENT_RESOURCES": "web-0,web-1",
    }
    assert json.loads(env["MBRIDGE_EVENT_JSON"]) == event_to_data(event)
    assert env["LANG"] == "C.UTF-8"
    assert "MBRIDGE_SIGNING_KEY" not in env
    assert runner.counts() == {"ok": 1, "failed": 0, "timeout": 0, "error": 0, "dropped": 0}


def test_what_is_not_known_is_not_set(tmp_path: Path) -> None:
    path, record = recorder(tmp_path)
    runner = HookRunner(parse_command(f"'{path}' '{record}'"), timeout=10.0)
    runner.notify(reboot(not_before=None, duration_seconds=-1, event_source=None))
    assert runner.settle(10.0)
    env = runs(record)[0]["env"]
    for name in ("MBRIDGE_EVENT_NOT_BEFORE", "MBRIDGE_EVENT_DURATION_SECONDS", "MBRIDGE_EVENT_SOURCE"):
        assert name not in env


def test_each_change_runs_the_hook_in_order(tmp_path: Path) -> None:
    path, record = recorder(tmp_path)
    runner = HookRunner(parse_command(f"'{path}' '{record}'"), timeout=10.0)
    for status in (EventStatus.SCHEDULED, EventStatus.STARTED, EventStatus.COMPLETED):
        runner.notify(reboot(status=status))
    assert runner.settle(20.0)
    assert [run["env"]["MBRIDGE_EVENT_STATUS"] for run in runs(record)] == ["scheduled", "started", "completed"]


def test_a_hook_that_fails_is_logged_with_its_exit_code_and_output_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = script(tmp_path, "fail.py", "print('cannot reach the pager', file=sys.stderr)\nsys.exit(3)")
    metrics = Metrics()
    runner = HookRunner(parse_command(str(path)), timeout=10.0, metrics=metrics)
    with caplog.at_level(logging.INFO, logger="mbridge.agent.hooks"):
        runner.notify(reboot())
        assert runner.settle(10.0)
    assert "hook for E-1 scheduled: exit 3 in" in caplog.text
    assert "its output ends: cannot reach the pager" in caplog.text
    assert metrics.value("mbridge_hook_runs_total", result="failed") == 1
    assert runner.counts()["failed"] == 1


def test_a_hook_past_its_timeout_is_killed_with_everything_it_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a hook that starts a child of its own, then both sleep far past the timeout
    pids = tmp_path / "pids"
    path = script(
        tmp_path,
        "sleep.py",
        "import subprocess\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)",
    )
    metrics = Metrics()
    runner = HookRunner(parse_command(str(path)), timeout=1.0, metrics=metrics)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mbridge.agent.hooks"):
        runner.notify(reboot())
        assert runner.settle(10.0)
    # THEN it was stopped at the timeout, not after its minute
    assert time.monotonic() - start < 5.0
    assert runner.counts()["timeout"] == 1
    assert metrics.value("mbridge_hook_runs_total", result="timeout") == 1
    assert "killed after the 1 s timeout" in caplog.text
    # AND its child went with it (the whole process group was killed)
    _hook_pid, child_pid = (int(pid) for pid in pids.read_text(encoding="utf-8").split())
    wait_until(lambda: not alive(child_pid), 5.0, f"the hook's child {child_pid} to be gone")


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting for its parent (init reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_notify_never_waits_and_a_full_queue_drops_the_oldest(tmp_path: Path) -> None:
    # GIVEN a hook that takes a second, and room for one waiting change
    record, started = tmp_path / "runs.txt", tmp_path / "started"
    path = script(
        tmp_path,
        "slow.py",
        f"open({str(started)!r}, 'a').write('x')\n"
        f"time.sleep(1)\nopen({str(record)!r}, 'a').write(os.environ['MBRIDGE_EVENT_ID'] + ' ')",
    )
    metrics = Metrics()
    runner = HookRunner(parse_command(str(path)), timeout=10.0, capacity=1, metrics=metrics)
    # WHEN three changes come at once
    start = time.monotonic()
    runner.notify(reboot("E-1"))
    wait_until(started.exists, 5.0, "the first run to start")
    runner.notify(reboot("E-2"))
    runner.notify(reboot("E-3"))
    # THEN telling it took no time, the one waiting longest (E-2) was dropped and counted
    assert time.monotonic() - start < 0.9
    assert runner.settle(10.0)
    assert record.read_text(encoding="utf-8").split() == ["E-1", "E-3"]
    assert runner.counts()["dropped"] == 1
    assert metrics.value("mbridge_hook_dropped_total") == 1


def test_every_log_line_about_a_change_names_its_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a hook that holds its first run until released, then exits 0 for E-1 and 3 for the others,
    # with room for one waiting change
    started, release = tmp_path / "started", tmp_path / "release"
    path = script(
        tmp_path,
        "held.py",
        f"open({str(started)!r}, 'a').write('x')\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
        "sys.exit(0 if os.environ['MBRIDGE_EVENT_ID'] == 'E-1' else 3)",
    )
    runner = HookRunner(parse_command(str(path)), timeout=30.0, capacity=1)
    with caplog.at_level(logging.DEBUG, logger="mbridge.agent"):
        # WHEN three changes come while the first runs (the one waiting longest is dropped), the hook
        # is released, and then one runner cannot start its command and another fails outright
        runner.notify(reboot("E-1"))
        wait_until(started.exists, 10.0, "the first run to start")
        runner.notify(reboot("E-2"))
        runner.notify(reboot("E-3"))
        release.touch()
        assert runner.settle(20.0)
        missing = HookRunner([str(tmp_path / "gone")], timeout=5.0)
        missing.notify(reboot("E-4"))
        assert missing.settle(10.0)

        def broken(event: MaintenanceEvent) -> None:
            raise RuntimeError("the hook runner broke")

        monkeypatch.setattr(missing, "run", broken)
        missing.notify(reboot("E-5"))
        assert missing.settle(10.0)

    # THEN a run that went well, one that failed, one dropped, one that could not start and one that
    # broke were logged
    said: dict[str, str] = {}
    for record in caplog.records:
        said[getattr(record, "event_id", "")] = said.get(getattr(record, "event_id", ""), "") + record.getMessage()
    assert "exit 0" in said["E-1"]
    assert "hook not run for reboot E-2 scheduled" in said["E-2"]
    assert "exit 3" in said["E-3"]
    assert "could not be started" in said["E-4"]
    assert "could not be run" in said["E-5"]
    assert "" not in said
    # ... each line naming its event as the agent's other lines do, for jq 'select(.event_id == ...)'
    fields = [{name: getattr(record, name, None) for name in ("kind", "status", "vm")} for record in caplog.records]
    assert fields == [{"kind": "reboot", "status": "scheduled", "vm": "web-0"}] * len(caplog.records)
    assert len(caplog.records) == 6  # the broken run is also logged as its error


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("'/opt/hook", "cannot be split into words"),
        ("/nonexistent/hook.sh --now", "'/nonexistent/hook.sh' is not an executable file"),
    ],
)
def test_a_command_that_cannot_be_run_is_refused(command: str, message: str) -> None:
    with pytest.raises(HookCommandError, match=message):
        parse_command(command)


def test_a_script_without_the_execute_bit_is_refused(tmp_path: Path) -> None:
    path = script(tmp_path, "hook.sh", "")
    path.chmod(0o644)
    with pytest.raises(HookCommandError, match="is not an executable file"):
        parse_command(str(path))


def test_a_program_on_path_is_found() -> None:
    argv = parse_command("env -0")
    assert Path(argv[0]).name == "env"
    assert argv[1:] == ["-0"]


def test_a_hook_that_prints_without_end_keeps_only_the_end_of_its_output(tmp_path: Path) -> None:
    # GIVEN a hook that prints as fast as it can until it is killed, and says where its output goes
    where = tmp_path / "stdout-kind"
    path = script(
        tmp_path,
        "flood.py",
        "import stat\n"
        f"open({str(where)!r}, 'w').write('file' if stat.S_ISREG(os.fstat(1).st_mode) else 'not a file')\n"
        "while True:\n    sys.stdout.write('x' * 65536)",
    )
    # WHEN it runs past its timeout
    run = HookRunner(parse_command(str(path)), timeout=1.0).run(reboot())
    # THEN it was killed at the timeout, and of all it printed only the end was kept
    assert run.result == "timeout"
    assert 0 < len(run.output) <= OUTPUT_TAIL_BYTES
    assert set(run.output) == {"x"}
    # AND its output never went to a file (which would have grown for the whole timeout)
    assert where.read_text(encoding="utf-8") == "not a file"


def test_a_process_the_hook_leaves_running_is_not_waited_for(tmp_path: Path) -> None:
    # GIVEN a hook that starts a process in the background, which keeps the hook's output open, and exits
    pid_file = tmp_path / "pid"
    path = script(
        tmp_path,
        "daemon.py",
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started the daemon', flush=True)",
    )
    try:
        # WHEN it runs
        start = time.monotonic()
        run = HookRunner(parse_command(str(path)), timeout=30.0).run(reboot())
        # THEN its run ends with it (not with what it left running), with what it printed
        assert time.monotonic() - start < 10.0
        assert (run.result, run.output) == ("ok", "started the daemon")
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text(encoding="utf-8")), signal.SIGKILL)


def test_the_output_tail_keeps_the_last_bytes_of_what_was_written() -> None:
    read_end, write_end = os.pipe()
    tail = _OutputTail(os.fdopen(read_end, "rb"))
    with os.fdopen(write_end, "wb") as pipe:
        pipe.write(b"a" * (1024 * 1024) + b"\xc3\xa9END")
    assert tail.text(10.0) == "a" * (OUTPUT_TAIL_BYTES - 5) + "\u00e9END"
