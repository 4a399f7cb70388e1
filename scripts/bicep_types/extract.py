"""Extract the subset of Azure/bicep-types-az that the Bicep of infra/azure/ needs, into the fixture.

    python -m scripts.bicep_types.extract --snapshot DIR [--commit REV] [--out DIR] [BICEP_DIR ...]

DIR is a git directory of https://github.com/Azure/bicep-types-az (a bare clone does: nothing is
checked out, every file is read with `git show`). For each `Type@apiVersion` the Bicep files
declare (nested and `existing` resources too), the resource type and every type node it reaches
are copied, renumbered, into `<out>/<provider>/<namespace>/<apiVersion>/types.json`, the path it
has under `generated/` upstream; `index.json` maps the resource types to them as upstream's does.
`versions.json` lists every API version the snapshot publishes for each declared resource type,
`SOURCE` names the repository, the commit, the files read and this command.

Run it again whenever an API version in infra/azure/ changes; the check says when it is needed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scripts.bicep_types import bicep
from scripts.bicep_types.definitions import FIXTURE, ROOT

REPOSITORY = "https://github.com/Azure/bicep-types-az"
# A resource type node's name as upstream writes it in a types.json: "name": "Type@apiVersion"
_RESOURCE_NAME = re.compile(r'"name": "([^"@]+)@([^"]+)"')


class SnapshotError(Exception):
    """The snapshot cannot be read as expected."""


class Snapshot:
    """One commit of a git directory of Azure/bicep-types-az, read without a work tree."""

    def __init__(self, git_dir: Path, revision: str) -> None:
        self.git_dir = git_dir
        self.commit = self._git("rev-parse", "--verify", f"{revision}^{{commit}}").strip()
        self.date = self._git("show", "-s", "--format=%cI", self.commit).strip()
        self._files: dict[str, list[dict[str, Any]]] = {}

    def _git(self, *args: str) -> str:
        run = subprocess.run(  # noqa: S603 - a fixed argument list
            ["git", f"--git-dir={self.git_dir}", *args],  # noqa: S607 - git from PATH, as a developer runs it
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode not in (0, 1) or (run.returncode == 1 and run.stderr.strip()):
            raise SnapshotError(f"git {' '.join(args[:2])} failed ({run.returncode}): {run.stderr.strip()[-1000:]}")
        return run.stdout

    def published(self, resource_types: Iterable[str]) -> dict[str, dict[str, list[str]]]:
        """For each resource type (lower case): each API version published for it with the
        types.json files that define it, and under the key "" its spelling upstream; found with
        one `git grep` over every types.json of the commit."""
        names = sorted({name.lower() for name in resource_types})
        if not names:
            return {}
        alternatives = "|".join(re.escape(name) for name in names)
        output = self._git(
            "grep",
            "-i",
            "-o",
            "-E",
            f'"name": "({alternatives})@[^"]+"',
            self.commit,
            "--",
            "generated/*/types.json",
        )
        found: dict[str, dict[str, list[str]]] = {}
        for line in output.splitlines():
            # <commit>:<path>:"name": "Type@version"
            _, path, match = line.split(":", 2)
            parsed = _RESOURCE_NAME.search(match)
            if parsed is None:
                continue
            spelled, version = parsed.groups()
            entry = found.setdefault(spelled.lower(), {"": [spelled]})
            entry.setdefault(version, []).append(path)
        return found

    def types(self, path: str) -> list[dict[str, Any]]:
        if path not in self._files:
            loaded = json.loads(self._git("show", f"{self.commit}:{path}"))
            if not isinstance(loaded, list):
                raise SnapshotError(f"{path}: not a JSON array of type nodes")
            self._files[path] = loaded
        return self._files[path]


def declared_types(directories: Iterable[Path]) -> dict[str, str]:
    """`{type@apiVersion lower case: as written}` for every resource declared under the directories."""
    declared: dict[str, str] = {}
    for directory in directories:
        for path in sorted(directory.rglob("*.bicep")):
            for resource in bicep.read(path).resources:
                declared.setdefault(resource.type_key.lower(), resource.type_key)
    return declared


def references(node: Any) -> Iterable[int]:
    """The indexes every `{"$ref": "#/<n>"}` within a node points to."""
    if isinstance(node, dict):
        pointer = node.get("$ref")
        if isinstance(pointer, str) and len(node) == 1:
            if not pointer.startswith("#/"):
                raise SnapshotError(f"a reference outside its file is not supported: {pointer}")
            yield int(pointer[2:])
            return
        for value in node.values():
            yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def renumbered(node: Any, mapping: dict[int, int]) -> Any:
    if isinstance(node, dict):
        pointer = node.get("$ref")
        if isinstance(pointer, str) and len(node) == 1:
            return {"$ref": f"#/{mapping[int(pointer[2:])]}"}
        return {key: renumbered(value, mapping) for key, value in node.items()}
    if isinstance(node, list):
        return [renumbered(value, mapping) for value in node]
    return node


def subset(types: list[dict[str, Any]], roots: Iterable[int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The nodes reachable from `roots`, in their original order, and old index → new index."""
    reached: set[int] = set()
    pending = list(roots)
    while pending:
        index = pending.pop()
        if index in reached:
            continue
        reached.add(index)
        pending.extend(references(types[index]))
    mapping = {old: new for new, old in enumerate(sorted(reached))}
    return [renumbered(types[old], mapping) for old in sorted(reached)], mapping


def extract(snapshot: Snapshot, bicep_dirs: list[Path], out: Path) -> list[str]:
    """Write the fixture; returns the warnings (a declared type or version the snapshot lacks)."""
    declared = declared_types(bicep_dirs)
    published = snapshot.published(key.partition("@")[0] for key in declared)
    warnings: list[str] = []
    chosen: dict[str, list[tuple[str, int]]] = {}  # upstream path -> (resource name, index)
    for key, written in sorted(declared.items()):
        resource_type, _, version = key.partition("@")
        versions = published.get(resource_type)
        if versions is None:
            warnings.append(f"{written}: no such resource type in {REPOSITORY} at {snapshot.commit}")
            continue
        # An API version is matched as Bicep matches it: without regard to case.
        paths = next(
            (paths for published_version, paths in versions.items() if published_version.lower() == version), []
        )
        if not paths:
            warnings.append(f"{written}: API version {version} is not published for {versions[''][0]}")
            continue
        path = sorted(paths)[0]  # a version split over several provider folders: the first is read
        for number, node in enumerate(snapshot.types(path)):
            if node.get("$type") == "ResourceType" and str(node.get("name", "")).lower() == key:
                chosen.setdefault(path, []).append((str(node["name"]), number))
                break
        else:
            warnings.append(f"{written}: {path} names it but holds no ResourceType for it")

    for stale in sorted(out.glob("*/*/*/types.json")):
        stale.unlink()
    index: dict[str, dict[str, str]] = {}
    for path, resources in sorted(chosen.items()):
        nodes, mapping = subset(snapshot.types(path), (number for _, number in resources))
        relative = path.removeprefix("generated/")
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nodes, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        for name, number in resources:
            index[name] = {"$ref": f"{relative}#/{mapping[number]}"}
    _remove_empty_folders(out)
    (out / "index.json").write_text(
        json.dumps({"resources": dict(sorted(index.items()))}, indent=1) + "\n", encoding="utf-8"
    )
    listed = {entry[""][0]: sorted(version for version in entry if version) for _, entry in sorted(published.items())}
    (out / "versions.json").write_text(json.dumps(listed, indent=1) + "\n", encoding="utf-8")
    (out / "SOURCE").write_text(_source(snapshot, sorted(chosen), bicep_dirs), encoding="utf-8")
    return warnings


def _source(snapshot: Snapshot, paths: list[str], bicep_dirs: list[Path]) -> str:
    folders = " ".join(str(_shown(directory)) for directory in bicep_dirs)
    lines = [
        f"repository: {REPOSITORY}",
        f"commit: {snapshot.commit}",
        f"commit-date: {snapshot.date}",
        f"command: python -m scripts.bicep_types.extract --snapshot <git dir of the repository> {folders}",
        "paths:",
        *(f"  {path}" for path in paths),
    ]
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> Path:
    resolved = path.resolve()
    return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved


def _remove_empty_folders(out: Path) -> None:
    for folder in sorted((path for path in out.rglob("*") if path.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--snapshot", type=Path, required=True, help="a git directory of Azure/bicep-types-az")
    parser.add_argument("--commit", default="HEAD", help="the revision to read (default: HEAD)")
    parser.add_argument("--out", type=Path, default=FIXTURE, help=f"the fixture folder (default: {_shown(FIXTURE)})")
    parser.add_argument("bicep", type=Path, nargs="*", default=[ROOT / "infra" / "azure"], help="Bicep folders")
    args = parser.parse_args(argv)
    try:
        snapshot = Snapshot(args.snapshot, args.commit)
        args.out.mkdir(parents=True, exist_ok=True)
        warnings = extract(snapshot, args.bicep, args.out)
    except (SnapshotError, bicep.BicepSyntaxError, OSError, json.JSONDecodeError) as error:
        print(f"extract: {error}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"extract: {warning}", file=sys.stderr)
    print(f"extract: wrote {_shown(args.out)} from {REPOSITORY} at {snapshot.commit}")
    return 1 if warnings else 0


if __name__ == "__main__":
    sys.exit(main())
