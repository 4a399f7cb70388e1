"""Rewrite tests/fixtures/envelopes/*.json from the recorded metadata documents.

Run only after an intended change of the envelope format, then review the diff:
the golden files are the contract that tests/unit/test_envelope.py holds the code to.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures import FIXTURES  # noqa: E402
from tests.golden import golden_envelopes  # noqa: E402


def main() -> int:
    target = FIXTURES / "envelopes"
    target.mkdir(exist_ok=True)
    for name, document in golden_envelopes().items():
        (target / f"{name}.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {target / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
