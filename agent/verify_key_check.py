"""`python -m agent.verify_key_check`: load the verification key given on stdin; exit 0 when it
loads, else exit 2 with the reason as the last line of stderr (agent/main.py check_verify_key)."""

from __future__ import annotations

import sys

from wire.errors import BridgeError
from wire.signing import load_public_key

EXIT_CONFIG = 2


def main() -> int:
    try:
        load_public_key(sys.stdin.read())
    except BridgeError as exc:
        print(str(exc).replace("\n", " "), file=sys.stderr)
        return EXIT_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main())
