"""`mbridge demo`: start everything, play the flows, show the timeline, check every expectation.

Exit codes: 0 every expectation held; 1 one did not (the first is named); 2 the demo could not
be set up (e.g. `--bus pubsub-emulator` without the emulator installed).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from functions.core.policy import Policy
from mbridge.demo.errors import DemoSetupError
from mbridge.demo.flows import FLOWS, Context, Flow
from mbridge.demo.play import play
from mbridge.demo.report import LiveLines, summary, write_html
from mbridge.demo.world import DemoWorld, EmbeddedWorld

BUSES = ("embedded", "pubsub-emulator")
# The longest drain period the flows can be played with: each of three phases waits it out before
# an approval, within the phase's time (play.PHASE_TIMEOUT) and the demo's 60 s in all.
MAX_DRAIN_PERIOD = 10.0
# The speeds the flows are timed for (each end was played): slower, a Spot eviction's 30 s of notice
# or a dead agent's 60 s outlast the phase; faster, the dead agent's Reboot is over before the
# functions find its agent silent (3 s).
MIN_SPEED, MAX_SPEED = 4.0, 30.0


def configure(parser: argparse.ArgumentParser) -> None:
    # The count comes from the flows themselves, so no text can say another.
    phases = sorted({flow.phase for flow in FLOWS})
    parser.description = (
        f"{parser.description or ''} It plays {len(FLOWS)} maintenance flows in {len(phases)} phases: "
        + "; ".join(f"{phase}: {', '.join(f.key for f in FLOWS if f.phase == phase)}" for phase in phases)
        + " (docs/demo.md)."
    ).strip()
    parser.add_argument(
        "--bus",
        choices=BUSES,
        default="embedded",
        help="embedded: SQLite bus and the local function host (default); pubsub-emulator: Google's "
        "Pub/Sub and Firestore emulators, the Cloud Functions entry served by functions-framework",
    )
    parser.add_argument(
        "--report",
        metavar="FILE.html",
        type=_report_path,
        help="also write the timeline as a self-contained HTML page (its directory must exist)",
    )
    parser.add_argument(
        "--workdir",
        type=_workdir,
        help="where state, audit log and logs go, created if need be (default: a new temp dir)",
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=10.0,
        help=f"simulated seconds per real second, {MIN_SPEED:g} to {MAX_SPEED:g} (default 10)",
    )
    parser.add_argument(
        "--drain-period",
        type=_drain_period,
        default=3.0,
        help=f"the policy's drain period, shortened for the demo: 0 to {MAX_DRAIN_PERIOD:g} s (default 3 s)",
    )


# Checked as the flags are read, so that a value the demo cannot run with is a usage error (exit 2,
# one line naming the flag) rather than a traceback or a run that fails as if the product were wrong.


def _speed(text: str) -> float:
    return _between(text, MIN_SPEED, MAX_SPEED, "simulated seconds per real second: the flows are timed for these")


def _drain_period(text: str) -> float:
    return _between(text, 0.0, MAX_DRAIN_PERIOD, "seconds: the demo's phases wait it out")


def _between(text: str, low: float, high: float, why: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a number between {low:g} and {high:g} ({why}), got {text!r}")
    return value


def _workdir(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot create {text}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {text}")
    return path


def _report_path(text: str) -> str:
    folder = Path(text).parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{folder} is not a directory: the page would be written there")
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: give the page's file name")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {folder}")
    return text


def run(args: argparse.Namespace) -> int:
    return run_flows(args, FLOWS)


def run_flows(args: argparse.Namespace, flows: Sequence[Flow]) -> int:
    """The demo on `flows` (the tests play a few flows, or a flow made to fail)."""
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="mbridge-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    live = LiveLines(sys.stdout)
    # A dead agent's VM is drained on the control plane's word once its agent was silent for 3 s (a
    # minute by default: the demo runs ten times faster, and its agents report within a second).
    # The demo's pools are the agents' /readyz read directly: a VM is out the moment it turns unready,
    # with no probe interval to wait (readiness_probe_seconds 0; docs/policy.md#probe-aware-drains).
    policy = Policy(
        drain_period_seconds=args.drain_period,
        readiness_probe_seconds=0,
        silent_agents="drain",
        silent_agent_seconds=3.0,
    )
    with ExitStack() as cleanup:
        cleanup.enter_context(_logging_to(workdir / "demo.log"))
        live.say(f"maintenance-bridge demo on the {args.bus} bus; work dir {workdir}")
        try:
            world = _world(args.bus, workdir, policy, args.speed, cleanup, live.say)
        except DemoSetupError as exc:
            print(f"mbridge demo: {exc}", file=sys.stderr)
            return 2
        for line in world.describe():
            live.say(line)
        live.say(
            f"6 agents (web-0..2 in an availability set, spot-0, vmss-0, gce-0), speed {args.speed:g}x, "
            f"default policy with a {args.drain_period:g} s drain period, and silent agents' VMs drained after "
            f"{policy.silent_agent_seconds:g} s"
        )
        live.hold = world.witness_lag
        result = play(world, flows, Context(args.drain_period), live)
        notes = [f"variant: {args.bus}", *world.describe()]
    for line in summary(result):
        print(line)
    for note in notes:
        print(note)
    if args.report:
        write_html(result, args.report, f"maintenance-bridge demo ({args.bus})", notes)
        print(f"report: {Path(args.report).resolve()}")
    failure = result.first_failure()
    if failure is not None:
        print(f"FAILED: {failure.title}: {failure.expectation} — seen: {failure.failure}", file=sys.stderr)
        return 1
    return 0


def _world(
    bus: str, workdir: Path, policy: Policy, speed: float, cleanup: ExitStack, progress: Callable[[str], None]
) -> DemoWorld:
    if bus == "embedded":
        embedded = EmbeddedWorld(workdir, policy, speed)
        cleanup.callback(embedded.close)
        return embedded.start()
    from mbridge.demo.pubsub_world import PubSubWorld

    emulated = PubSubWorld(workdir, policy, speed)
    cleanup.callback(emulated.close)
    return emulated.start(progress=progress)


@contextmanager
def _logging_to(path: Path) -> Iterator[None]:
    """Everything the agents and functions log goes to the work dir: the terminal shows the timeline."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s"))
    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.handlers[:], level = before
        root.setLevel(level)
        handler.close()
