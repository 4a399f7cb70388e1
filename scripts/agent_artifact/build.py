"""Builds the agent's artifacts: one PEX file per bus, the same bytes from the same commit.

    make agent-artifact                          # every bus, from HEAD, into dist/
    python -m scripts.agent_artifact.build --bus servicebus --ref v0.1.0 --out dist

Each artifact is `mbridge-agent-<bus>-<version>.pex` (`mbridge-agent-<version>.pex` for the jsonl and
local transports), with `<name>.sha256` next to it (sha256sum's format). It holds the project's wheel,
built from the commit (`git archive`, not the working tree), and the wheels of requirements/agent[-<bus>].txt,
the hashed lock `make agent-locks` writes: pip checks every download against those hashes. For each
target, Linux x86_64 (glibc 2.28 or newer) and Windows x64, on CPython 3.9 to 3.13, it carries the
matching wheels, so a VM needs its python3 and this one file, nothing else.

Reproducible: SOURCE_DATE_EPOCH is the commit's time (the project wheel's timestamps), PEX writes its
zip entries sorted with fixed timestamps, and the tools are pinned (the Makefile's build virtualenv:
pex, setuptools; pex's pip version below). The PEX is built with its tools: the installers turn it
into a virtualenv with `PEX_TOOLS=1 python3 <file> venv <dir>`, which needs no index and no pip.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = Path(__file__).resolve().parent / "platforms"
# The lock of each artifact, and the project's extra it stands for (None: the jsonl and local transports).
BUSES: dict[str, tuple[str, str | None]] = {
    "servicebus": ("agent-servicebus", "agent-servicebus"),
    "pubsub": ("agent-pubsub", "agent-pubsub"),
    "plain": ("agent", None),
}
# Windows targets: pex's abbreviated platforms, with a full Python version so that Requires-Python
# (cryptography: != 3.9.0, != 3.9.1) is judged against a real release.
WINDOWS = ("3.9.13", "3.10.11", "3.11.9", "3.12.10", "3.13.9")
PIP_VERSION = "25.3"  # the pip pex resolves with (the one `make locks` uses)
INTERPRETERS = "CPython>=3.9,<3.14"


def artifact_name(bus: str, version: str) -> str:
    return f"mbridge-agent-{version}.pex" if bus == "plain" else f"mbridge-agent-{bus}-{version}.pex"


def run(command: list[str], **kwargs: object) -> None:
    subprocess.run(command, check=True, **kwargs)  # type: ignore[call-overload]  # noqa: S603 - this module's own arguments


def export(ref: str, target: Path) -> int:
    """The tree of `ref` in `target`; returns the commit's time (SOURCE_DATE_EPOCH)."""
    epoch = int(
        subprocess.run(  # noqa: S603 - git with the ref asked for
            ["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%ct", ref],  # noqa: S607 - git from PATH
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    archive = target.with_suffix(".tar")
    run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", f"--output={archive}", ref])
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    return epoch


def project_wheel(source: Path, target: Path, environment: dict[str, str]) -> Path:
    """The project's wheel, built with this virtualenv's setuptools (no build isolation: pinned, offline)."""
    run(
        [
            sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
            "--disable-pip-version-check", "--wheel-dir", str(target), str(source),
        ],
        env=environment,
    )  # fmt: skip
    [wheel] = target.glob("maintenance_bridge-*.whl")
    return wheel


def build(bus: str, source: Path, wheel: Path, out: Path, environment: dict[str, str], work: Path) -> Path:
    lock, extra = BUSES[bus]
    version = wheel.name.split("-")[1]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    requirements = work / f"{bus}.txt"
    # The lock and the project's wheel by its hash: pip runs in hash-checking mode for all of it.
    requirements.write_text(
        (source / "requirements" / f"{lock}.txt").read_text(encoding="utf-8")
        # (by a path relative to the scratch directory pex runs in: PEX-INFO records the requirement as given)
        + f"./{wheel.relative_to(work).as_posix()}{f'[{extra}]' if extra else ''} --hash=sha256:{digest}\n",
        encoding="utf-8",
    )
    target = out / artifact_name(bus, version)
    platforms: list[str] = []
    for platform in sorted(PLATFORMS.glob("linux_*.json")):
        platforms += ["--complete-platform", str(platform)]
    for python in WINDOWS:
        major, minor, _ = python.split(".")
        platforms += ["--platform", f"win_amd64-cp-{python}-cp{major}{minor}"]
    pex = Path(sys.executable).with_name("pex")
    run(
        [
            str(pex), "--requirement", str(requirements), "--console-script", "mbridge",
            "--include-tools", "--venv", "prepend", "--interpreter-constraint", INTERPRETERS, *platforms,
            "--no-build", "--pip-version", PIP_VERSION, "--no-allow-pip-version-fallback",
            "--python-shebang", "/usr/bin/env python3", "--no-emit-warnings", "--output-file", str(target),
        ],
        env=environment,
        cwd=work,
    )  # fmt: skip
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    target.with_name(target.name + ".sha256").write_text(f"{digest}  {target.name}\n", encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bus", choices=[*BUSES, "all"], default="all", help="which artifact (default: all)")
    parser.add_argument("--ref", default="HEAD", help="the commit to build (default: HEAD)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "dist", help="where to write (default: dist/)")
    args = parser.parse_args(argv)
    buses = list(BUSES) if args.bus == "all" else [args.bus]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mbridge-agent-build-") as scratch:
        work = Path(scratch)
        source = work / "source"
        epoch = export(args.ref, source)
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PEX_"))},
            "SOURCE_DATE_EPOCH": str(epoch),
            # Against PyPI alone, whatever this machine's pip configuration adds: every hash is one it serves.
            "PIP_CONFIG_FILE": os.devnull,
        }
        wheel = project_wheel(source, work / "wheel", environment)
        for bus in buses:
            started = time.monotonic()
            target = build(bus, source, wheel, args.out.resolve(), environment, work)
            print(
                f"{target}  {target.stat().st_size / 2**20:.1f} MiB  {time.monotonic() - started:.0f} s  "
                f"sha256 {hashlib.sha256(target.read_bytes()).hexdigest()}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
