"""scripts/build_function_package.py: the deployment zip holds both app roots and the code they import."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.build_function_package import build

# Prints where every loaded module of ours came from.
IMPORT_BOTH_APPS = """
import sys
sys.path.insert(0, ".")
import function_app, main
ours = ("wire", "functions", "agent", "simulator", "mbridge", "main", "function_app")
for name, module in sorted(sys.modules.items()):
    if name.split(".")[0] in ours and getattr(module, "__file__", None):
        print(module.__file__)
"""


def test_package_holds_both_app_roots_and_nothing_of_the_workspace(tmp_path: Path) -> None:
    names = set(build(tmp_path / "package.zip"))

    assert {"host.json", "function_app.py", "main.py", "requirements.txt"} <= names
    assert "functions/core/process.py" in names
    assert any(name.startswith("wire/schemas/") and name.endswith(".json") for name in names)
    assert "wire/transports/pubsub/__init__.py" in names  # the Pub/Sub command sender reuses it
    assert "wire/transports/servicebus/__init__.py" in names
    assert not [name for name in names if name.split("/")[0] in {"tests", "infra", "docs", ".venv", "node_modules"}]
    # the VM's agent, the simulator, the command line and the local app stay out of the cloud package
    assert not [name for name in names if name.split("/")[0] in {"agent", "simulator", "mbridge"}]
    assert not [name for name in names if name.startswith("functions/local_app/")]
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_same_sources_give_the_same_bytes(tmp_path: Path) -> None:
    build(tmp_path / "one.zip")
    build(tmp_path / "two.zip")

    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "two.zip").read_bytes()


def test_both_entry_modules_import_from_the_unpacked_package_alone(tmp_path: Path) -> None:
    # GIVEN the package unpacked where nothing of the checkout is importable
    build(tmp_path / "package.zip")
    app_root = tmp_path / "app"
    with zipfile.ZipFile(tmp_path / "package.zip") as archive:
        archive.extractall(app_root)

    # WHEN the platforms' loaders import the entry modules (the libraries come from this interpreter)
    run = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_BOTH_APPS],
        cwd=app_root,
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
        timeout=60,
        check=False,
    )

    # THEN every module they need is in the package, and came from it (not from the checkout)
    assert run.returncode == 0, run.stderr
    loaded_from = {Path(line) for line in run.stdout.split()}
    assert loaded_from
    assert all(path.is_relative_to(app_root) for path in loaded_from), loaded_from
