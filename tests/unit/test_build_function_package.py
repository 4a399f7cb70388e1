"""scripts/build_function_package.py: one zip per cloud, its app root, its lock and the code it imports."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.build_function_package import CLOUDS, ROOT, build, main
from tests.unit.test_function_requirements import APPS, App, assert_is_a_lock, reachable

# Imports one entry module, then prints where every loaded module of ours came from.
IMPORT_ONE_APP = """
import sys
sys.path.insert(0, ".")
import {entry}
ours = ("wire", "functions", "agent", "simulator", "mbridge", "main", "function_app")
for name, module in sorted(sys.modules.items()):
    if name.split(".")[0] in ours and getattr(module, "__file__", None):
        print(module.__file__)
"""
APP_ROOTS = {"azure": {"host.json", "function_app.py"}, "gcp": {"main.py"}}
OTHER_CLOUD = {"azure": "gcp", "gcp": "azure"}
BUS = {"azure": "servicebus", "gcp": "pubsub"}
# The agent's side of the transports: its factory and the local buses of the demo and tests.
AGENT_TRANSPORTS = {"wire/transports/factory.py", "wire/transports/local.py", "wire/transports/jsonl.py"}


def built(cloud: str, tmp_path: Path) -> tuple[Path, set[str]]:
    output = tmp_path / CLOUDS[cloud].zip_name
    return output, set(build(CLOUDS[cloud], output))


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_each_zip_holds_its_app_root_and_nothing_of_the_other_cloud_or_the_workspace(
    cloud: str, tmp_path: Path
) -> None:
    _, names = built(cloud, tmp_path)

    assert APP_ROOTS[cloud] | {"requirements.txt"} <= names
    assert not APP_ROOTS[OTHER_CLOUD[cloud]] & names
    assert not [name for name in names if name.startswith(f"functions/{OTHER_CLOUD[cloud]}_app/")]
    assert not [name for name in names if name.startswith("requirements/")]
    assert f"functions/{cloud}_app/__init__.py" in names
    assert "functions/core/process.py" in names
    assert "functions/trust/verifiers.py" in names
    assert any(name.startswith("wire/schemas/") and name.endswith(".json") for name in names)
    assert not [name for name in names if name.split("/")[0] in {"tests", "infra", "docs", ".venv", "node_modules"}]
    # the VM's agent, the simulator, the command line and the local app stay out of the cloud packages
    assert not [name for name in names if name.split("/")[0] in {"agent", "simulator", "mbridge"}]
    assert not [name for name in names if name.startswith("functions/local_app/")]
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    # the cloud's own bus client only: not the other cloud's, nor the agent's factory and local buses
    assert f"wire/transports/{BUS[cloud]}/__init__.py" in names
    assert not [name for name in names if name.startswith(f"wire/transports/{BUS[OTHER_CLOUD[cloud]]}/")]
    assert not AGENT_TRANSPORTS & names


@pytest.mark.parametrize("app", APPS, ids=lambda app: app.cloud)
def test_each_zip_holds_every_module_its_entry_can_reach(app: App, tmp_path: Path) -> None:
    # function-level imports too, which importing the entry alone would not load
    _, names = built(app.cloud, tmp_path)

    for module in reachable(app.entry).modules:
        path = ROOT.joinpath(*module.split("."))
        name = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        assert name.relative_to(ROOT).as_posix() in names, module


@pytest.mark.parametrize("app", APPS, ids=lambda app: app.cloud)
def test_each_zips_requirements_are_its_clouds_lock(app: App, tmp_path: Path) -> None:
    output, _ = built(app.cloud, tmp_path)

    with zipfile.ZipFile(output) as archive:
        requirements = archive.read("requirements.txt")
    assert requirements == (ROOT / app.lock).read_bytes()
    # every line pinned with == and hashes: the remote build installs exactly these files
    assert assert_is_a_lock(requirements.decode("utf-8"))


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_same_sources_give_the_same_bytes(cloud: str, tmp_path: Path) -> None:
    build(CLOUDS[cloud], tmp_path / "one.zip")
    build(CLOUDS[cloud], tmp_path / "two.zip")

    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "two.zip").read_bytes()


@pytest.mark.parametrize("app", APPS, ids=lambda app: app.cloud)
def test_each_entry_module_imports_from_its_unpacked_zip_alone(app: App, tmp_path: Path) -> None:
    # GIVEN one cloud's zip unpacked where nothing of the checkout is importable
    output, _ = built(app.cloud, tmp_path)
    app_root = tmp_path / "app"
    with zipfile.ZipFile(output) as archive:
        archive.extractall(app_root)

    # WHEN the platform's loader imports the entry module (the libraries come from this interpreter)
    run = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_ONE_APP.format(entry=app.entry)],
        cwd=app_root,
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
        timeout=60,
        check=False,
    )

    # THEN every module it needs is in the zip, and came from it (not from the checkout)
    assert run.returncode == 0, run.stderr
    loaded_from = {Path(line) for line in run.stdout.split()}
    assert loaded_from
    assert all(path.is_relative_to(app_root) for path in loaded_from), loaded_from


def test_without_a_cloud_both_zips_are_built(tmp_path: Path) -> None:
    assert main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["function-azure.zip", "function-gcp.zip"]

    assert main(["--cloud", "gcp", "--output-dir", str(tmp_path / "gcp")]) == 0
    assert [path.name for path in (tmp_path / "gcp").iterdir()] == ["function-gcp.zip"]
