"""Build the function apps' deployment package: one zip for Azure Functions and Cloud Functions.

    python scripts/build_function_package.py [--output dist/function-package.zip]

The zip holds the app roots of both clouds and the code they import, nothing else:

    host.json, function_app.py   Azure Functions (Python v2 model)
    main.py                      Cloud Functions gen2 (functions framework)
    requirements.txt             installed by the platform's remote build
    wire/                        the wire contract and the bus transports the apps reuse
    functions/                   the core, proof verification and the two cloud apps

Not the agent, the simulator, the command line and its demo, nor the local app: the cloud
platforms never load them.

Azure ignores main.py and Cloud Functions ignores function_app.py, so one package serves both.
The zip is reproducible (sorted entries, fixed timestamps): the same sources give the same
bytes, so a deployment keyed on the zip's hash only changes when the code does.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP_FILES = ("host.json", "function_app.py", "main.py", "requirements.txt")
PACKAGES = ("wire", "functions")
SKIPPED_DIRS = {"__pycache__"}
# the local app is the demo's and `mbridge replay`'s host: no cloud loads it
LEFT_OUT = ("functions/local_app/",)
SKIPPED_SUFFIXES = {".pyc", ".pyo", ".db", ".db-wal", ".db-shm"}
# 1980-01-01, the earliest time a zip entry can carry
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def package_files(root: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """(file, name in the zip) for everything the package holds, in a stable order."""
    for name in APP_FILES:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run this from a full checkout of the repository")
        yield path, name
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            relative = path.relative_to(root)
            if not path.is_file() or SKIPPED_DIRS & set(relative.parts) or path.suffix in SKIPPED_SUFFIXES:
                continue
            if relative.as_posix().startswith(LEFT_OUT):
                continue
            yield path, relative.as_posix()


def build(output: Path, root: Path = ROOT) -> list[str]:
    """Write the zip; returns the names it holds."""
    output.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, name in package_files(root):
            entry = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes())
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the function apps' deployment zip.")
    parser.add_argument("--output", type=Path, default=ROOT / "dist" / "function-package.zip")
    args = parser.parse_args(argv)
    try:
        names = build(args.output)
    except FileNotFoundError as error:
        print(f"build_function_package: {error}", file=sys.stderr)
        return 2
    print(f"build_function_package: {args.output} ({len(names)} files, {args.output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
