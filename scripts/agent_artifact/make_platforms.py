"""Writes the agent artifact's Linux target platforms (pex's "complete platforms") from local interpreters.

Run once per new Python version, and commit the result: `make agent-artifact` reads these files,
so a build does not depend on the interpreters of the machine that runs it.

    python scripts/agent_artifact/make_platforms.py /path/to/python3.9 /path/to/python3.10 ...

Each file is what `pex3 interpreter inspect --markers --tags` reports, made machine-independent:
no interpreter path, no kernel release, and manylinux tags capped at glibc 2.28 (RHEL 8, Debian 10,
Ubuntu 20.04 and newer), so that no wheel built for a newer glibc than the VM's is chosen.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GLIBC_MAX = (2, 28)
PEX3 = Path(sys.executable).with_name("pex3")


def glibc_ok(tag: str) -> bool:
    match = re.search(r"manylinux_(\d+)_(\d+)_", tag)
    return not match or (int(match.group(1)), int(match.group(2))) <= GLIBC_MAX


def main(interpreters: list[str]) -> None:
    for interpreter in interpreters:
        inspected = json.loads(
            subprocess.run(  # noqa: S603 - pex3 on the interpreters given
                [str(PEX3), "interpreter", "inspect", "--python", interpreter, "--markers", "--tags"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        markers = inspected["marker_environment"]
        if markers["sys_platform"] != "linux" or markers["platform_machine"] != "x86_64":
            raise SystemExit(f"{interpreter}: not a Linux x86_64 interpreter")
        markers["platform_release"] = ""
        markers["platform_version"] = ""
        version = markers["python_version"]
        platform = {
            "marker_environment": markers,
            "compatible_tags": [tag for tag in inspected["compatible_tags"] if glibc_ok(tag)],
        }
        target = HERE / "platforms" / f"linux_x86_64-cp{version.replace('.', '')}.json"
        target.write_text(json.dumps(platform, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(target.relative_to(HERE.parent.parent))


if __name__ == "__main__":
    main(sys.argv[1:])
