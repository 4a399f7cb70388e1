"""Write the agent's configuration reference into docs/operations.md, from agent.config.SETTINGS.

    python -m scripts.gen_config_reference           # rewrite the section
    python -m scripts.gen_config_reference --check   # exit 1 when the section is out of date

Only the text between `<!-- BEGIN configuration -->` and `<!-- END configuration -->` is replaced:
the rest of the page is written by hand. tests/unit/agent/test_settings_reference.py fails when the
section no longer matches the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.config import SETTINGS, ConfigError, add_agent_arguments, settings_from_args
from agent.settings_spec import reference_table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "operations.md"
BEGIN = "<!-- BEGIN configuration -->"
END = "<!-- END configuration -->"
COMMAND = "python -m scripts.gen_config_reference"

PROSE = f"""\
<!-- Generated from agent/config.py (SETTINGS) by `{COMMAND}`: edit there, not here. -->

Every setting of `mbridge agent` can be given four ways; the first that sets it wins: its **flag**,
its **environment variable** (`MBRIDGE_<NAME>`, an empty one counts as unset), its **key in the
config file**, then the **default**. The config file is TOML, named by `--config FILE` or
`MBRIDGE_CONFIG`; its keys are the flags without their leading dashes, at the top level (no
`[section]`). An unknown key is an error that names the nearest known one. `mbridge approve` reads
its bus (the transport settings) and `cloud` the same way, from the same file; it has no default
transport.

```toml
# /etc/mbridge/agent.toml
cloud = "azure"
transport = "servicebus"
servicebus-namespace = "mybus.servicebus.windows.net"
verify-key = "/etc/mbridge/verify.pem"
poll-interval = 1
listen = "0.0.0.0:9797"
dry-run = false
```

Every value, from any source, is checked the same way: a choice must be one of its values, a
number must parse and respect its minimum, `HOST:PORT` must be one, and a switch takes only `true`,
`false`, `yes`, `no`, `1`, `0` (any case; on the command line `--x` / `--no-x`). A value that does
not pass stops the agent with one line on stderr, naming every place the setting can be given:

```
{{example}}
```

Exit codes of `mbridge agent`, also with `--check`: **0** all is well; **1** a problem that may
pass (the metadata service or the bus unreachable, a role on the bus not granted yet, the listen
port held by an agent still running): the agent retries on its own; **2** a configuration error
(a value of the wrong shape, or settings that cannot work together, such as a Service Bus
namespace and a connection string both set): fix the setting, retrying cannot help. The
installer (`infra/agent/install-agent.sh`) stops on 2 and starts the agent anyway on 1.
`mbridge agent --check` runs every start-up check and prints one line each (`ok` or `PROBLEM`): the configuration, the
verify key, the state directory (a database written for real), the listen address (bound and
released), the transport's SDK (imported as the transport does), the metadata service, this VM's
name, the proof of identity and the bus. `mbridge approve` exits 0 accepted, 1 rejected, 2 no
answer, and 2 too, before anything is sent, for a configuration error (one line
`mbridge approve: <setting> (...)`). `mbridge --version` and `mbridge agent --version` print the
release, which the start-up log line (`version`) and `/healthz` (`"version"`) carry too.
"""


def example_error() -> str:
    """The line the agent prints for MBRIDGE_POLL_INTERVAL=0.05, as the agent itself words it."""
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    try:
        settings_from_args(parser.parse_args([]), environ={"MBRIDGE_CLOUD": "azure", "MBRIDGE_POLL_INTERVAL": "0.05"})
    except ConfigError as exc:
        return f"mbridge agent: {exc}"
    raise AssertionError("MBRIDGE_POLL_INTERVAL=0.05 was accepted")


def section() -> str:
    """What goes between the markers: the prose, then the table of every setting."""
    return PROSE.replace("{example}", example_error()) + "\n" + reference_table(SETTINGS)


def render(document: str) -> str:
    """`document` with its configuration section replaced; ValueError without both markers."""
    start = document.find(BEGIN)
    end = document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} has no {BEGIN} ... {END} section")
    return document[: start + len(BEGIN)] + "\n" + section() + document[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the section is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{DOC} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        DOC.write_text(wanted, encoding="utf-8")
        print(f"wrote the configuration section of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
