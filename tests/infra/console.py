"""`terraform console` over a module of variables and locals, without any provider: how the tests
evaluate the expressions of the Terraform roots (shards, quota checks, signing keys) with
Terraform's own functions.

`needs_terraform` skips a test when no terraform binary is on PATH, except under CI=true, where
the binary is part of the image and its absence must fail the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

TERRAFORM = shutil.which("terraform")

needs_terraform = pytest.mark.skipif(
    TERRAFORM is None and os.environ.get("CI") != "true", reason="no terraform binary on PATH"
)


def evaluate(
    module: Path | None, expression: str, variables: dict[str, Any] | None = None, timeout: float = 120
) -> Any:
    """`expression` as `terraform console` evaluates it in `module` (None: no module, built-in
    functions only) with `variables` (written as terraform.tfvars.json); AssertionError carrying
    Terraform's diagnostic, on one line, when it refuses them."""
    if TERRAFORM is None:
        raise AssertionError("no terraform binary on PATH: the image carries one (docs/infra-validation.md)")
    if module is not None and variables is not None:
        (module / "terraform.tfvars.json").write_text(json.dumps(variables), encoding="utf-8")
    result = subprocess.run(
        [TERRAFORM, "console"],
        input=f"jsonencode({expression})\n",
        capture_output=True,
        text=True,
        cwd=module,
        env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull, "CHECKPOINT_DISABLE": "1", "NO_COLOR": "1"},
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0 or "Error:" in result.stderr:
        raise AssertionError(" ".join(result.stderr.replace("│", " ").replace("╷", " ").replace("╵", " ").split()))
    return json.loads(json.loads(result.stdout.strip()))
