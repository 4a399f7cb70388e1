"""`terraform init -backend=false` and `terraform validate` on Terraform roots, against the real
provider schemas, offline.

    python -m scripts.tfschema.validate --root infra/terraform/azure --root infra/terraform/gcp
        [--cache DIR] [--plugin-python PATH]

Providers cannot be downloaded here, so each pinned provider (providers.json) is served by a
schema-only plugin (plugin.py) answering with the schema derived from its prebuilt CDK for
Terraform package (derive.py, fetched by fetch.py). The plugins are installed as a `-plugin-dir`
of launchers that run plugin.py in the plugin's own virtualenv (`.venv-tfschema` by default).

Each root is copied to a temporary directory first: nothing (`.terraform`, the lock file) is
written into the repository. Terraform runs with a CLI configuration of its own, no checkpoint
calls and automation output. `init` also checks each `required_providers` constraint against the
pinned versions: a constraint they do not meet fails it. A root's committed `.terraform.lock.hcl`
goes into the copy without its checksums (the plugins here are not the registry's packages), so
`init` takes the locked versions: a lock whose version is not the pinned one, or that a
constraint does not admit, fails it.

Exit status: 0 every root is valid, 1 an error diagnostic (each is printed), 2 a tool, a package
or the plugin environment is missing or failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.tfschema import derive, fetch

ROOT = fetch.ROOT
PLUGIN_SOURCE = Path(__file__).with_name("plugin.py")
DEFAULT_PLUGIN_PYTHON = ROOT / ".venv-tfschema" / "bin" / "python"
PLATFORM = "linux_amd64"


class SetupError(Exception):
    """Something validation needs is missing or failed before Terraform could judge the roots."""


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    summary: str
    detail: str
    filename: str
    line: int

    def __str__(self) -> str:
        where = f"{self.filename}:{self.line}: " if self.filename else ""
        detail = f"\n    {self.detail}" if self.detail else ""
        return f"{self.severity}: {where}{self.summary}{detail}"


def schema_key(pin: fetch.Pin) -> str:
    """Derived schemas are reused while the package and the derivation code are unchanged."""
    code = Path(derive.__file__).read_bytes()
    return hashlib.sha256(pin.digest.encode() + b"\0" + code).hexdigest()[:16]


def _derive_to(tarball: Path, target: Path) -> None:
    partial = target.with_suffix(".part")
    partial.write_text(json.dumps(derive.derive(tarball), sort_keys=True), encoding="utf-8")
    os.replace(partial, target)


def ensure_schemas(cache: Path, pins: list[fetch.Pin]) -> dict[str, Path]:
    """`{provider source: derived schema JSON}`, fetching and deriving only what is not cached."""
    tarballs = fetch.fetch_all(cache, pins)
    schemas = cache / "schemas"
    schemas.mkdir(parents=True, exist_ok=True)
    targets = {pin.source: schemas / f"{pin.slug}-{schema_key(pin)}.json" for pin in pins}
    for pin in pins:  # schemas an earlier derivation code wrote
        for stale in schemas.glob(f"{pin.slug}-*.json"):
            if stale != targets[pin.source]:
                stale.unlink()
    todo = [(tarballs[source], target) for source, target in targets.items() if not target.is_file()]
    if todo:
        # The two large providers take a few seconds each: one process per core.
        with ProcessPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            for future in [pool.submit(_derive_to, tarball, target) for tarball, target in todo]:
                future.result()
    return targets


def build_plugin_dir(directory: Path, pins: list[fetch.Pin], schemas: Mapping[str, Path], python: Path) -> Path:
    """A `-plugin-dir` tree of launchers, one per pinned provider."""
    if not python.is_file():
        raise SetupError(f"{python} is missing: create the plugin's virtualenv first (make tfschema-venv)")
    for pin in pins:
        folder = directory / pin.source / pin.version / PLATFORM
        folder.mkdir(parents=True, exist_ok=True)
        launcher = folder / f"terraform-provider-{pin.name}_v{pin.version}"
        launcher.write_text(
            "#!/bin/sh\n"
            f"# Schema-only {pin.source} {pin.version} for terraform validate (scripts/tfschema).\n"
            f'exec "{python}" -s -B "{PLUGIN_SOURCE}" "{schemas[pin.source]}"\n',
            encoding="utf-8",
        )
        launcher.chmod(0o755)
    return directory


def terraform_env(home: Path) -> dict[str, str]:
    config = home / "terraformrc"
    config.write_text("# no provider installation settings: -plugin-dir decides\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update(
        TF_CLI_CONFIG_FILE=str(config),
        TF_IN_AUTOMATION="1",
        CHECKPOINT_DISABLE="1",
        TF_INPUT="0",
        TF_DATA_DIR=".terraform",
    )
    return env


def copy_root(root: Path, scratch: Path, repo: Path = ROOT) -> Path:
    """A copy of the root, without any Terraform working state, so a clean init happens there.

    The roots read files outside themselves (`file("${path.module}/../../agent/...")`, the
    function app's sources from the repository root), so the copy sits at the same place in a
    shadow of the repository: each directory on the way down is real, everything beside it is a
    symbolic link to the repository's own, and only the root itself is copied."""
    root = root.resolve()
    try:
        relative = root.relative_to(repo)
    except ValueError:
        relative = Path(root.name)
        repo = root.parent
    shadow = scratch / "tree"
    here, source = shadow, repo
    for part in relative.parts:
        here.mkdir(parents=True, exist_ok=True)
        for sibling in source.iterdir():
            link = here / sibling.name
            if sibling.name != part and not link.exists() and not link.is_symlink():
                link.symlink_to(sibling)
        here, source = here / part, source / part
        if here.is_symlink():  # linked while shadowing another root beside this one
            here.unlink()
    shutil.copytree(root, here, ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate*"))
    lock = root / LOCK_FILE
    if lock.is_file():
        (here / LOCK_FILE).write_text(without_checksums(lock.read_text(encoding="utf-8")), encoding="utf-8")
    return here


LOCK_FILE = ".terraform.lock.hcl"
_HASHES = re.compile(r"^[ \t]*hashes[ \t]*=[ \t]*\[[^\]]*\][ \t]*\n", re.MULTILINE)


def without_checksums(lock_text: str) -> str:
    """The lock file with its `hashes` lists removed: versions and constraints only.

    The schema-only plugins have checksums of their own, never the registry's; Terraform takes a
    locked provider without checksums, installs the locked version and checks it against the
    constraints."""
    return _HASHES.sub("", lock_text)


class Terraform:
    """Runs terraform in copied roots with one plugin dir and environment."""

    def __init__(self, plugin_dir: Path, home: Path, binary: str | None = None) -> None:
        found = binary or shutil.which("terraform")
        if not found:
            raise SetupError("terraform is not on PATH")
        self.binary = found
        self.plugin_dir = plugin_dir
        self.env = terraform_env(home)

    def run(self, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - terraform with arguments of this module's own
            [self.binary, *args],
            cwd=workdir,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )

    def init(self, workdir: Path) -> None:
        done = self.run(
            workdir, "init", "-backend=false", "-input=false", "-no-color", f"-plugin-dir={self.plugin_dir}"
        )
        if done.returncode != 0:
            raise SetupError(f"terraform init in {workdir} failed:\n{done.stdout}{done.stderr}".rstrip())

    def validate(self, workdir: Path) -> list[Diagnostic]:
        done = self.run(workdir, "validate", "-json", "-no-color")
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError as error:
            raise SetupError(f"terraform validate printed no JSON:\n{done.stdout}{done.stderr}") from error
        return [diagnostic_of(d) for d in report.get("diagnostics", [])]


def diagnostic_of(raw: Mapping[str, Any]) -> Diagnostic:
    start = (raw.get("range") or {}).get("start") or {}
    return Diagnostic(
        severity=str(raw.get("severity", "error")),
        summary=str(raw.get("summary", "")),
        detail=str(raw.get("detail", "")),
        filename=str((raw.get("range") or {}).get("filename", "")),
        line=int(start.get("line", 0)),
    )


def errors_in(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


@dataclass
class Setup:
    """Everything a validation run needs, prepared once."""

    terraform: Terraform
    pins: list[fetch.Pin]
    schemas: dict[str, Path]


def prepare(cache: Path, plugin_python: Path, scratch: Path) -> Setup:
    pins = fetch.load_pins()
    try:
        schemas = ensure_schemas(cache, pins)
    except (fetch.FetchError, derive.DeriveError) as error:
        raise SetupError(str(error)) from error
    plugin_dir = build_plugin_dir(scratch / "plugins", pins, schemas, plugin_python)
    return Setup(Terraform(plugin_dir, scratch), pins, schemas)


def validate_root(setup: Setup, root: Path, scratch: Path) -> list[Diagnostic]:
    workdir = copy_root(root, scratch)
    setup.terraform.init(workdir)
    return setup.terraform.validate(workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, action="append", required=True, help="a Terraform root (repeatable)")
    parser.add_argument("--cache", type=Path, default=fetch.DEFAULT_CACHE)
    parser.add_argument("--plugin-python", type=Path, default=DEFAULT_PLUGIN_PYTHON)
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="tfschema-") as scratch_name:
        scratch = Path(scratch_name)
        try:
            started = time.monotonic()
            setup = prepare(args.cache, args.plugin_python.absolute(), scratch)
            print(f"tfschema: {len(setup.pins)} provider schemas ready in {time.monotonic() - started:.1f}s")
            for root in args.root:
                started = time.monotonic()
                diagnostics = validate_root(setup, root.resolve(), scratch)
                errors = errors_in(diagnostics)
                for diagnostic in diagnostics:
                    print(f"{root}: {diagnostic}")
                verdict = f"{len(errors)} error(s)" if errors else "valid"
                print(f"tfschema: {root}: {verdict} ({time.monotonic() - started:.1f}s)")
                failed = failed or bool(errors)
        except SetupError as error:
            print(f"tfschema: {error}", file=sys.stderr)
            return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
