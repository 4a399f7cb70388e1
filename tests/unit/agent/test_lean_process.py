"""What `mbridge agent` keeps out of its own memory (docs/performance.md, the import table)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.agent_runner import ROOT
from wire.signing import generate_keypair

# Run in a fresh interpreter: the test process has loaded everything already.
PROBE = """
import json, sys
from mbridge import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
loaded = lambda name: sys.modules.get(name) is not None
print(json.dumps({name: loaded(name) for name in ("requests", "charset_normalizer", "chardet", "cryptography")}))
"""

CHECK_KEY = """
import json, sys
from agent.lean import leave_out_unused_modules
leave_out_unused_modules()
from agent.config import ConfigError
from agent.main import check_verify_key
from types import SimpleNamespace
try:
    check_verify_key(SimpleNamespace(verify_key=sys.argv[1]))
    outcome = "loaded"
except ConfigError as exc:
    outcome = str(exc)
print(json.dumps({"outcome": outcome, "cryptography": sys.modules.get("cryptography") is not None}))
"""


def probe(code: str, *arguments: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, *arguments], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_the_agent_process_loads_neither_requests_nor_cryptography_to_poll() -> None:
    loaded = probe(PROBE, "agent", "--version")
    assert loaded == {"requests": False, "charset_normalizer": False, "chardet": False, "cryptography": False}


def test_requests_loaded_in_the_agent_process_comes_without_a_character_detector_or_a_warning() -> None:
    # As when a bus transport's SDK imports it (-W error: the warning requests gives is filtered)
    loaded = probe(PROBE.replace("loaded = lambda", "import requests\nloaded = lambda"), "agent", "--version")
    assert loaded["requests"] is True
    assert loaded["charset_normalizer"] is False
    assert loaded["chardet"] is False


def test_other_commands_keep_the_detector() -> None:
    loaded = probe(PROBE.replace("loaded = lambda", "import requests\nloaded = lambda"), "--version")
    assert loaded["requests"] is True
    assert loaded["charset_normalizer"] is True


def test_the_verify_key_is_checked_at_start_in_a_child_and_cryptography_stays_out() -> None:
    answer = probe(CHECK_KEY, generate_keypair()[1].decode())
    assert answer == {"outcome": "loaded", "cryptography": False}


def test_a_verify_key_that_does_not_load_is_refused_with_the_loaders_reason() -> None:
    answer = probe(CHECK_KEY, "notakey")
    assert isinstance(answer["outcome"], str)
    assert answer["outcome"].startswith("verify key (--verify-key / MBRIDGE_VERIFY_KEY")
    assert answer["cryptography"] is False
