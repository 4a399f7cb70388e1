"""Run a command several times with CPU-burning processes beside it: the suite must not depend on how
fast the machine is (no test may hang on elapsed wall-clock time).

    python scripts/busy.py [--burners 2] [--runs 5] -- make check
    make check-busy                       # `make check` and the unit suite, 5 runs each, 2 burners

Each burner is a process spinning on arithmetic at normal priority, so the command competes for
every core of a 2-core machine. The command's own output goes to its terminal; a summary line per
run (its exit status and how long it took) and the count of passing runs are printed at the end.
Exit status: 0 when every run passed, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from collections.abc import Sequence


def burn() -> None:
    """Spin until killed."""
    counter = 0
    while True:
        counter = (counter * 1103515245 + 12345) % 2147483648


def positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not 0 or more")
    return value


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--burners", type=positive, default=2, help="CPU-burning processes (default 2)")
    parser.add_argument("--runs", type=positive, default=5, help="how many times to run the command (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if not command:
        parser.error("give the command to run after --, e.g. -- make check")
    arguments.command = command
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse(sys.argv[1:] if argv is None else argv)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(arguments.burners)]
    for burner in burners:
        burner.start()
    results: list[tuple[int, float]] = []
    try:
        for run in range(1, arguments.runs + 1):
            print(f"busy: run {run}/{arguments.runs} of {' '.join(arguments.command)} beside {len(burners)} burner(s)")
            started = time.monotonic()
            status = subprocess.run(arguments.command, check=False).returncode  # noqa: S603 - the operator's command
            results.append((status, time.monotonic() - started))
    finally:
        for burner in burners:
            burner.kill()
            burner.join()
    for run, (status, seconds) in enumerate(results, start=1):
        print(f"busy: run {run}: exit {status} in {seconds:.0f} s")
    passed = sum(1 for status, _ in results if status == 0)
    print(f"busy: {passed}/{len(results)} runs passed with {len(burners)} CPU burner(s)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
