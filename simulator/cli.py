"""`mbridge simulate`: run the metadata simulator until SIGINT/SIGTERM.

stdout carries exactly one line per VM, its base URL, printed (and flushed) before anything else so
tools can read them; everything the simulator does is logged to stderr, one line each.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable

from simulator.scenarios import SCENARIO_NAMES, Scenario, ScenarioError, describe_scenarios, load_scenario
from simulator.server import Simulator

_LOGGER_NAME = "simulator"


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (documented timings are divided by it), got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535 (0: any free ports), got {value}")
    return value


def _scenario(text: str) -> Scenario:
    try:
        return load_scenario(text)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to `parser` (docs/contracts.md#simulator-cli)."""
    parser.add_argument(
        "--cloud",
        choices=["azure", "gce"],
        default=None,
        help="which metadata service to simulate (default: the scenario's cloud, else azure)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=_port,
        default=0,
        help="first port; VMs get consecutive ports (default 0: any free run of ports)",
    )
    parser.add_argument(
        "--vm-name",
        action="append",
        dest="vm_names",
        metavar="NAME",
        help="a VM to serve (repeat for more; each gets its own port; one shared event store); "
        "default: the scenario's VMs, else vm-0 (azure) or gce-vm-0 (gce)",
    )
    parser.add_argument(
        "--scenario",
        type=_scenario,
        default=None,
        metavar="NAME|FILE",
        help=f"a built-in scenario ({', '.join(SCENARIO_NAMES)}) or a .json/.yaml scenario file",
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="F",
        help="run documented timings F times faster (default 1; 60 turns 15 minutes into 15 seconds)",
    )
    parser.add_argument(
        "--trust-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="write what verifies this run's proofs of identity (its test keys) to PATH, for the functions' "
        "MBRIDGE_TRUST_FILE (see docs/security.md)",
    )
    listing = "; ".join(f"{name}: {text.rstrip('.')}" for name, text in describe_scenarios().items())
    parser.epilog = f"Built-in scenarios - {listing}. Control API under <url>/_sim/ (see docs/simulator.md)."


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 then, 2 for unusable options, 1 when the ports cannot be bound."""
    try:
        simulator = Simulator(
            cloud=args.cloud,
            vm_names=args.vm_names,
            speed=args.speed,
            scenario=args.scenario,
            host=args.host,
            port=args.port,
        )
    except (ScenarioError, ValueError) as exc:
        print(f"mbridge simulate: error: {exc}", file=sys.stderr)
        return 2

    logger = logging.getLogger(_LOGGER_NAME)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    stop_requested: list[int] = []  # signal numbers received; a list because handlers must not take locks
    restore = _on_stop_signals(stop_requested)
    try:
        try:
            simulator.start()
        except OSError as exc:
            print(f"mbridge simulate: error: {exc}", file=sys.stderr)
            return 1
        if args.trust_file is not None:
            _write_trust_file(simulator, args.trust_file)
            logger.info("trust file (this run's test keys): %s", args.trust_file)
        for url in simulator.base_urls:
            print(url)
        sys.stdout.flush()
        # Wake up now and then rather than block forever: the signal handler only records the signal.
        while not stop_requested:
            time.sleep(0.1)
        logger.info("stopping (signal %d)", stop_requested[0])
        return 0
    finally:
        simulator.stop()
        restore()
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _write_trust_file(simulator: Simulator, path: Path) -> None:
    """The run's trust file, readable by its owner only (it names the run's VMs, no secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(simulator.trust(), indent=1) + "\n", encoding="utf-8")
    path.chmod(0o600)


def _on_stop_signals(stop_requested: list[int]) -> Callable[[], None]:
    """Make SIGINT and SIGTERM request a clean stop; returns what undoes it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach only the main thread; the caller stops us some other way

    def handle(signum: int, frame: FrameType | None) -> None:
        stop_requested.append(signum)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mbridge simulate",
        description="Local Azure IMDS Scheduled Events / GCE metadata simulator with a control API and faults.",
    )
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
