"""The expectations a flow states, each a check over what really happened to its event: the agents'
envelopes on the bus, the functions' audit log, and the simulator's log of approval POSTs.

A check returns None when the expectation held, else what was seen instead.
"""

from __future__ import annotations

from mbridge.demo.flows.model import Context, Expectation
from mbridge.demo.timeline import EventTimeline


def drained(*vms: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if sorted(set(timeline.drained)) == sorted(vms) else f"drained {sorted(set(timeline.drained))}"

    return Expectation(f"drained {', '.join(vms)}", check)


def drained_once_each() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        repeats = sorted({vm for vm in timeline.drained if timeline.drained.count(vm) > 1})
        return f"drained more than once: {repeats}" if repeats else None

    return Expectation("each VM drained once", check)


def never_drained() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"drained {timeline.drained}" if timeline.drained else None

    return Expectation("never drained", check)


def restored(*vms: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if sorted(timeline.restored) == sorted(vms) else f"restored {sorted(timeline.restored)}"

    return Expectation(f"restored {', '.join(vms)} once", check)


def never_restored() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"restored {timeline.restored}" if timeline.restored else None

    return Expectation("never restored (the VM is gone)", check)


def approved_once(by: tuple[str, ...] | None = None) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        accepted = timeline.accepted_approvals()
        if len(accepted) != 1 or len(timeline.approve_commands) != 1:
            return f"{len(accepted)} approval POSTs accepted by IMDS, {len(timeline.approve_commands)} sent"
        posts = sorted({approval.vm for approval in timeline.approvals})
        if by is not None and posts != sorted(by):
            return f"approval POSTed by {posts}"
        return None

    who = f" by {', '.join(by)} only" if by else ""
    return Expectation(f"approved once{who}", check)


def refused(*kinds: str) -> Expectation:
    """The functions refused the forgeries, and their audit log says why (one record each)."""

    def check(timeline: EventTimeline, _: Context) -> str | None:
        seen = sorted(refusal.kind for refusal in timeline.refusals)
        if seen != sorted(kinds) or len(timeline.forged) != len(kinds):
            why = [(refusal.kind, refusal.reason) for refusal in timeline.refusals]
            return f"refused {seen} of {len(timeline.forged)} forged report(s): {why}"
        return None

    return Expectation(f"forged reports refused ({', '.join(kinds)}), the audit log says why", check)


def approved_at_once() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        commands = timeline.approve_commands
        if not commands:
            return "no approval sent"
        return None if commands[0].execute_at is None else f"approval held until {commands[0].execute_at:%H:%M:%S}"

    return Expectation("approved at once", check)


def approved_after_drain_period() -> Expectation:
    def check(timeline: EventTimeline, context: Context) -> str | None:
        # The drain period runs from the last VM out: an approval starts the event for all of them.
        drains = [stages["drained"] for stages in timeline.vm_stages.values() if "drained" in stages]
        drain, approval = max(drains, default=timeline.stages.get("drained")), timeline.stages.get("approved")
        if drain is None or approval is None:
            return f"drained at {drain}, approved at {approval}"
        waited = (approval - drain).total_seconds()
        # The agent POSTs on its next command-loop turn after execute_at: never before it.
        if waited < context.drain_period_seconds - 0.05:
            return f"approved {waited:.2f} s after the drain (drain period {context.drain_period_seconds:g} s)"
        return None

    return Expectation("approved after the drain period", check)


def found_silent(*vms: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if sorted(set(timeline.silent)) == sorted(vms) else f"found silent: {sorted(set(timeline.silent))}"

    return Expectation(f"{', '.join(vms)}'s agent found silent", check)


def never_approved() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        accepted = timeline.accepted_approvals()
        return f"IMDS accepted {len(accepted)} approval(s)" if accepted else None

    return Expectation("never approved", check)


def reached(stage: str) -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return None if stage in timeline.stages else f"never {stage}"

    return Expectation(stage, check)


def ended_as(status: str) -> Expectation:
    """The event ended so, as its agents reported it or, when none could, as the control plane did."""

    def check(timeline: EventTimeline, _: Context) -> str | None:
        ended = timeline.ended_as or timeline.ended_centrally
        return None if ended == status else f"ended as {ended or 'nothing yet'}"

    return Expectation(status, check)


def silent_after_start() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        return f"ended as {timeline.ended_as}" if timeline.ended_as is not None else None

    # The VM is deleted once the event started; no other VM sees the event, so nobody reports its end.
    return Expectation("nothing reported after started (the VM is deleted)", check)


def restored_after_end() -> Expectation:
    def check(timeline: EventTimeline, _: Context) -> str | None:
        end, back = timeline.ended_at or timeline.stages.get("completed"), timeline.stages.get("restored")
        if end is None or back is None:
            return f"ended at {end}, restored at {back}"
        return None if back >= end else "restored before the maintenance ended"

    return Expectation("restored only once the maintenance was over", check)
