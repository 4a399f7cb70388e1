"""Fetch the pinned provider packages (providers.json) into a cache directory, verified.

    python -m scripts.tfschema.fetch [--cache DIR]

npm packages come with `npm pack` and are checked against the registry's sha512 integrity; the
PyPI wheel comes with `pip download --no-deps` and is checked against its sha256, then the
npm-format tarball inside it is taken out. A file already in the cache is used again when its
digest still matches; one that does not match is fetched again, and a fresh download that does
not match is an error. The cache holds one npm-format tarball per provider:
`<cache>/packages/<namespace>-<name>-<provider version>.tgz`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PINS = Path(__file__).with_name("providers.json")
DEFAULT_CACHE = ROOT / ".tfschema-cache"


class FetchError(Exception):
    """A package could not be fetched, or did not match its pinned digest."""


@dataclass(frozen=True)
class Pin:
    """One provider and the package its schema is derived from."""

    source: str  # registry.terraform.io/<namespace>/<name>
    version: str
    package: dict[str, Any]

    @property
    def namespace(self) -> str:
        return self.source.split("/")[1]

    @property
    def name(self) -> str:
        return self.source.split("/")[2]

    @property
    def slug(self) -> str:
        return f"{self.namespace}-{self.name}-{self.version}"

    @property
    def digest(self) -> str:
        """The pinned digest of the downloaded file, which also keys derived schemas."""
        return str(self.package.get("integrity") or f"sha256-{self.package['sha256']}")


def load_pins(path: Path = PINS) -> list[Pin]:
    document = json.loads(path.read_text(encoding="utf-8"))
    return [Pin(p["source"], p["version"], p["package"]) for p in document["providers"]]


def npm_integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download_matches(pin: Pin, path: Path) -> bool:
    if not path.is_file():
        return False
    if pin.package["kind"] == "npm":
        return npm_integrity(path) == str(pin.package["integrity"])
    return sha256_of(path) == str(pin.package["sha256"])


def _download_name(pin: Pin) -> str:
    package = pin.package
    name, version = str(package["name"]), str(package["version"])
    if package["kind"] == "npm":
        return name.lstrip("@").replace("/", "-") + f"-{version}.tgz"
    return name.replace("-", "_") + f"-{version}-py3-none-any.whl"


def fetch_all(cache: Path = DEFAULT_CACHE, pins: list[Pin] | None = None) -> dict[str, Path]:
    """`{provider source: npm-format tarball}` for every pin, downloading only what is missing."""
    pins = load_pins() if pins is None else pins
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    missing = [pin for pin in pins if not _download_matches(pin, downloads / _download_name(pin))]
    npm_missing = [pin for pin in missing if pin.package["kind"] == "npm"]
    pypi_missing = [pin for pin in missing if pin.package["kind"] == "pypi"]
    if npm_missing:
        _npm_pack(npm_missing, downloads)
    for pin in pypi_missing:
        _pip_download(pin, downloads)
    tarballs: dict[str, Path] = {}
    packages = cache / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        download = downloads / _download_name(pin)
        if not _download_matches(pin, download):
            raise FetchError(f"{download.name} does not match the pinned digest {pin.digest}")
        if pin.package["kind"] == "npm":
            tarballs[pin.source] = download
            continue
        target = packages / f"{pin.slug}.tgz"
        if not target.is_file():
            with zipfile.ZipFile(download) as wheel, wheel.open(pin.package["member"]) as member:
                partial = target.with_suffix(".part")
                partial.write_bytes(member.read())
                os.replace(partial, target)
        tarballs[pin.source] = target
    return tarballs


def _npm_pack(pins: list[Pin], downloads: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("npm is not on PATH: it fetches the provider packages")
    specs = [f"{pin.package['name']}@{pin.package['version']}" for pin in pins]
    with tempfile.TemporaryDirectory(dir=downloads) as scratch:
        done = subprocess.run(  # noqa: S603 - a fixed argument list with the pinned specs
            [npm, "pack", *specs, "--pack-destination", scratch, "--json", "--ignore-scripts"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise FetchError(f"npm pack {' '.join(specs)} failed:\n{done.stderr.strip()}")
        for pin in pins:
            fetched = Path(scratch) / _download_name(pin)
            if not _download_matches(pin, fetched):
                raise FetchError(f"{fetched.name} from npm does not match the pinned integrity {pin.digest}")
            os.replace(fetched, downloads / fetched.name)


def _pip_download(pin: Pin, downloads: Path) -> None:
    spec = f"{pin.package['name']}=={pin.package['version']}"
    with tempfile.TemporaryDirectory(dir=downloads) as scratch:
        done = subprocess.run(  # noqa: S603 - a fixed argument list with the pinned spec
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                spec,
                "-d",
                scratch,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise FetchError(f"pip download {spec} failed:\n{done.stderr.strip()}")
        fetched = Path(scratch) / _download_name(pin)
        if not _download_matches(pin, fetched):
            raise FetchError(f"{fetched.name} from PyPI does not match the pinned sha256 {pin.digest}")
        os.replace(fetched, downloads / fetched.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    try:
        for source, path in fetch_all(args.cache).items():
            print(f"{source}: {path}")
    except FetchError as error:
        print(f"fetch: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
