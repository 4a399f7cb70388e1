""".funcignore keeps exactly what scripts/build_function_package.py puts in the Azure zip.

(Cloud Functions deploys from the GCP zip, by Terraform or unpacked for gcloud: a root upload would carry
the root requirements.txt, the Azure lock, so there is no .gcloudignore.)
"""

from __future__ import annotations

from pathlib import Path

from scripts.build_function_package import CLOUDS, PACKAGES

ROOT = Path(__file__).resolve().parents[2]


def patterns(ignore_file: str) -> set[str]:
    return {
        line.strip().rstrip("/")
        for line in (ROOT / ignore_file).read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }


def test_azure_upload_leaves_the_workspace_and_the_other_apps_behind_and_keeps_the_app() -> None:
    azure = CLOUDS["azure"]
    found = patterns(".funcignore")

    assert {".git", ".venv*", "node_modules", "tests", "infra", "__pycache__"} <= found
    assert {"/agent", "/simulator", "/mbridge"} <= found
    assert {prefix.rstrip("/") for prefix in azure.left_out} <= found
    assert {"/main.py", "/requirements"} <= found  # the Cloud Function's entry and lock
    assert not {name.lstrip("/") for name in found} & {*azure.app_files, azure.lock, *PACKAGES}


def test_there_is_no_gcloudignore() -> None:
    assert not (ROOT / ".gcloudignore").exists()
