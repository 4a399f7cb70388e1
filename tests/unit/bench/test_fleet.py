"""The fleet benchmark at a tiny size on the local bus: what it counts is what it must be."""

from __future__ import annotations

from pathlib import Path

from bench.fleet import CYCLE_MESSAGES, FleetSize, local_figures, run_local

TINY = FleetSize(agents=20, wave=5, lone=1, processes=1, threads=4, idle_window=1.0, wave_timeout=60.0)


def test_a_tiny_fleet_holds_nothing_idle_and_approves_each_wave_event_once(tmp_path: Path) -> None:
    run = run_local(tmp_path, TINY, in_process=True)

    assert run.idle.receives_held
    assert max(run.idle.receives_held) == 0
    assert max(run.idle.paths_open) == 0
    assert run.idle.counts["receive_calls"] == 0
    wave = run.wave
    assert not wave.problems
    assert set(wave.approved) == set(wave.events)
    assert all(wave.posts[key] == 1 for key in wave.events)  # one StartRequests POST per event
    assert wave.messages["report.scheduled"] == TINY.wave
    assert wave.messages["command.approve"] == TINY.wave
    assert wave.messages["result"] == TINY.wave
    assert sum(wave.messages.values()) == CYCLE_MESSAGES * TINY.wave
    assert wave.invocations == 2 * TINY.wave  # the report and the approval's result
    assert wave.lb_writes == TINY.wave  # one removal each; nothing restored before the event ends
    assert set(run.lone.approved) == set(run.lone.events)
    figures = {figure.name: figure for figure in local_figures(run)}
    assert figures["fleet.local.idle_receives_held"].met
    assert figures["fleet.local.wave_approvals"].met
    assert figures["fleet.local.messages_per_event"].met
