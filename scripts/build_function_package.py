"""Build the function apps' deployment packages: one zip per cloud.

    python scripts/build_function_package.py [--cloud azure|gcp] [--output-dir dist]

Each zip holds one cloud's app root and the code it imports, nothing else:

    dist/function-azure.zip   host.json, function_app.py (Azure Functions, Python v2 model), requirements.txt
                              (the Azure lock, the root requirements.txt), wire/ but the Pub/Sub
                              transport, functions/ but gcp_app/
    dist/function-gcp.zip     main.py (Cloud Functions gen2, functions framework), requirements.txt (the GCP
                              lock, requirements/gcp.txt), wire/ but the Service Bus transport,
                              functions/ but azure_app/

The platform's remote build installs the zip's requirements.txt: a lock pinned with `==` and hashes
(`make locks`), so each cloud installs its own libraries and only those, the same ones every time.
Not the agent, the simulator, the command line and its demo, the local app, nor the agent's transport
factory and local buses: no cloud loads them.
Without --cloud, both zips. Each is reproducible (sorted entries, fixed timestamps): the same sources
give the same bytes, so a deployment keyed on the zip's hash only changes when the code does.
infra/terraform/gcp/function.tf builds the same files as the GCP zip (tests/infra keep the two equal).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wire", "functions")
SKIPPED_DIRS = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo", ".db", ".db-wal", ".db-shm"}
# 1980-01-01, the earliest time a zip entry can carry
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Cloud:
    name: str
    app_files: tuple[str, ...]  # the app root's files, at the zip's root as in the repository's
    lock: str  # goes in as requirements.txt
    # the other cloud's app and bus client, the local app (the demo's and `mbridge replay`'s host)
    # and the agent's transports: prefixes of paths
    left_out: tuple[str, ...]

    @property
    def zip_name(self) -> str:
        return f"function-{self.name}.zip"


# What no function imports: the local app, and the agent's side of the transports (its factory and
# the local buses of the demo and the tests).
_NO_CLOUD = (
    "functions/local_app/",
    "wire/transports/factory.py",
    "wire/transports/local.py",
    "wire/transports/jsonl.py",
)

CLOUDS = {
    "azure": Cloud(
        "azure",
        ("host.json", "function_app.py"),
        "requirements.txt",
        ("functions/gcp_app/", "wire/transports/pubsub/", *_NO_CLOUD),
    ),
    "gcp": Cloud(
        "gcp", ("main.py",), "requirements/gcp.txt", ("functions/azure_app/", "wire/transports/servicebus/", *_NO_CLOUD)
    ),
}


def _required(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run this from a full checkout of the repository")
    return path


def package_files(cloud: Cloud, root: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """(file, name in the zip) for everything one cloud's package holds, in a stable order."""
    for name in cloud.app_files:
        yield _required(root / name), name
    yield _required(root / cloud.lock), "requirements.txt"
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            relative = path.relative_to(root)
            if not path.is_file() or SKIPPED_DIRS & set(relative.parts) or path.suffix in SKIPPED_SUFFIXES:
                continue
            if relative.as_posix().startswith(cloud.left_out):
                continue
            yield path, relative.as_posix()


def build(cloud: Cloud, output: Path, root: Path = ROOT) -> list[str]:
    """Write one cloud's zip; returns the names it holds."""
    output.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, name in package_files(cloud, root):
            entry = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes())
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the function apps' deployment zips, one per cloud.")
    parser.add_argument("--cloud", choices=sorted(CLOUDS), help="one cloud's zip only (default: both)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "dist")
    args = parser.parse_args(argv)
    clouds = [CLOUDS[args.cloud]] if args.cloud else list(CLOUDS.values())
    for cloud in clouds:
        output = args.output_dir / cloud.zip_name
        try:
            names = build(cloud, output)
        except FileNotFoundError as error:
            print(f"build_function_package: {error}", file=sys.stderr)
            return 2
        print(f"build_function_package: {output} ({len(names)} files, {output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
