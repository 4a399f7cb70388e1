"""The agent's artifact (make agent-artifact, scripts/agent_artifact/build.py) and its installation.

GIVEN the hashed locks under requirements/ and the commit checked out
WHEN  the Service Bus artifact is built twice, and installed by install-agent.sh from that one file
      with a Python 3.9 interpreter, no index and no proxy that answers
THEN  both builds are the same bytes, the file holds the locked wheels for Linux and Windows, and the
      installer checks its SHA-256, makes a virtualenv from it, runs `mbridge agent --check` and
      leaves the interpreter's own site-packages as they were; a file with another hash is refused
      before anything runs from it.

The builds download the locked wheels from PyPI once (pex keeps them in ~/.cache/pex): about a
minute, then half a minute for the second build.
"""

from __future__ import annotations

import glob
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from simulator import Simulator
from tests.infra.sources import REPO_ROOT
from tests.infra.test_agent_install import FAKES, INSTALLER, UNIT, Sandbox

BUILD_VENV = REPO_ROOT / ".venv-agent-build"
LOCKS = REPO_ROOT / "requirements"


def python39() -> str:
    """A CPython 3.9, the oldest python3 the agent supports (as .ci/run finds one), else this one."""
    candidates = ["/usr/bin/python3.9", "/usr/local/bin/python3.9"]
    pyenv = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False) if _has("pyenv") else None
    if pyenv and pyenv.returncode == 0:
        candidates += sorted(glob.glob(f"{pyenv.stdout.strip()}/versions/3.9*/bin/python"))
    for candidate in candidates:
        if Path(candidate).exists():
            return candidate
    return sys.executable


def _has(command: str) -> bool:
    return subprocess.run(["sh", "-c", f"command -v {command}"], capture_output=True, check=False).returncode == 0


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for name, body in FAKES.items():
        path = fakes / name
        path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        path.chmod(0o755)
    root = tmp_path / "root"
    (root / "etc" / "mbridge").mkdir(parents=True)
    return Sandbox(root=root, fakes=fakes)


def build(out: Path, commit: str) -> Path:
    subprocess.run(
        [
            str(BUILD_VENV / "bin" / "python"),
            "-m",
            "scripts.agent_artifact.build",
            "--bus",
            "servicebus",
            "--ref",
            commit,
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        check=True,
        timeout=900,
    )
    [artifact] = out.glob("mbridge-agent-servicebus-*.pex")
    return artifact


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    subprocess.run(["make", "--no-print-directory", "agent-build-venv"], cwd=REPO_ROOT, check=True, timeout=600)
    # one commit for both builds, whatever is committed meanwhile
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return build(tmp_path_factory.mktemp("first"), commit), build(tmp_path_factory.mktemp("second"), commit)


@pytest.fixture(scope="module")
def metadata_url() -> object:
    with Simulator(cloud="azure", vm_names=["web-0"]) as sim:
        yield sim.base_urls[0]


def locked(lock: Path) -> dict[str, str]:
    return {
        re.sub(r"[-_.]+", "-", name).lower(): version
        for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", lock.read_text(encoding="utf-8"), re.M)
    }


# ---------------------------------------------------------------- the locks (fast)


def test_the_agent_locks_are_made_from_pyproject_and_pin_every_dependency_with_hashes() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def requirements(name: str) -> set[str]:
        lines = (LOCKS / name).read_text(encoding="utf-8").splitlines()
        kept = {re.sub(r"\s+#.*$", "", line).strip() for line in lines if not line.startswith(("#", "-r"))}
        return {line.replace(" ", "") for line in kept if line}

    base = {r.replace(" ", "") for r in project["dependencies"]}
    assert requirements("agent.in") == base
    for extra in ("agent-servicebus", "agent-pubsub"):
        assert requirements(f"{extra}.in") == {r.replace(" ", "") for r in project["optional-dependencies"][extra]}
    for lock in ("agent", "agent-servicebus", "agent-pubsub"):
        text = (LOCKS / f"{lock}.txt").read_text(encoding="utf-8")
        assert "make agent-locks" in text
        pins = locked(LOCKS / f"{lock}.txt")
        assert "cryptography" in pins
        # every pin carries its hashes: pip then checks every file it downloads
        for block in re.split(r"\n(?=\S)", text):
            if re.match(r"^[A-Za-z0-9._-]+==", block):
                assert "--hash=sha256:" in block, block
    assert {"azure-servicebus", "azure-identity"} <= set(locked(LOCKS / "agent-servicebus.txt"))
    assert "google-cloud-pubsub" in locked(LOCKS / "agent-pubsub.txt")


def test_the_installer_refuses_an_artifact_without_its_sha256(sandbox: Sandbox) -> None:
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\n", encoding="utf-8")
    (sandbox.etc / "install.env").write_text(
        "MBRIDGE_PACKAGE=https://example.com/mbridge-agent-servicebus-0.1.0.pex\n", encoding="utf-8"
    )
    result = sandbox.run(INSTALLER)
    assert result.returncode == 1
    assert "the artifact URL in MBRIDGE_PACKAGE has no SHA-256" in result.stderr
    assert "MBRIDGE_PACKAGE=https://<host>/mbridge-agent-servicebus-X.Y.Z.pex#sha256=" in result.stderr
    assert sandbox.calls() == []


# ---------------------------------------------------------------- the builds (slow: PyPI, then the cache)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_builds_of_one_commit_are_the_same_bytes(artifacts: tuple[Path, Path]) -> None:
    first, second = artifacts
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    for artifact in artifacts:
        assert artifact.with_name(artifact.name + ".sha256").read_text(encoding="utf-8") == f"{digest}  {first.name}\n"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_artifact_holds_the_locked_wheels_for_linux_and_windows(artifacts: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(artifacts[0]) as pex:
        wheels = sorted(
            {name.split("/")[1] for name in pex.namelist() if name.startswith(".deps/") and name != ".deps/"}
        )
    assert wheels, "no .deps in the artifact"
    assert all(wheel.endswith(".whl") for wheel in wheels)  # built wheels only: nothing compiles on a VM
    found = {re.sub(r"[-_.]+", "-", w.split("-")[0]).lower(): w.split("-")[1] for w in wheels}
    pins = locked(LOCKS / "agent-servicebus.txt")
    assert {name: found.get(name) for name in pins} == pins  # exactly the locked versions, tomli included
    assert (
        found["maintenance-bridge"] == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    )
    cffi = [w for w in wheels if w.startswith("cffi-")]
    for python in ("cp39", "cp310", "cp311", "cp312", "cp313"):
        assert any(f"-{python}-" in w and "manylinux" in w for w in cffi), python
        assert any(f"-{python}-" in w and w.endswith("win_amd64.whl") for w in cffi), python
    # no Linux wheel that needs a newer glibc than 2.28 is the only choice for a target
    assert any(w.startswith("cryptography-") and "manylinux_2_28" in w for w in wheels)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_installer_installs_the_artifact_with_python39_offline_and_runs_the_check(
    sandbox: Sandbox, artifacts: tuple[Path, Path], metadata_url: str
) -> None:
    artifact = artifacts[0]
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    python = python39()
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    before = sorted(p.name for p in Path(site).iterdir()) if Path(site).exists() else []
    # GIVEN the artifact by URL with its hash, agent settings on the jsonl transport for web-0, and
    # a Python 3.9 with no index and no proxy that answers: the file is all there is
    (sandbox.etc / "agent.env").write_text(
        f"MBRIDGE_CLOUD=azure\nMBRIDGE_METADATA_URL={metadata_url}\nMBRIDGE_TRANSPORT=jsonl\n", encoding="utf-8"
    )
    (sandbox.etc / "install.env").write_text(f"MBRIDGE_PACKAGE={artifact.as_uri()}#sha256={digest}\n", encoding="utf-8")
    dead = "http://127.0.0.1:9"
    sandbox.extra_env.update(
        {
            "MBRIDGE_PYTHON": python,
            "PIP_NO_INDEX": "1",
            **dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), dead),
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    # WHEN the installer runs
    result = sandbox.run(INSTALLER, "--unit", str(UNIT), timeout=600)
    # THEN it installed the artifact into a virtualenv of that Python and the agent's check passed
    assert result.returncode == 0, result.stderr
    assert "check: healthy" in result.stderr
    assert "this VM's name: web-0" in result.stderr
    assert (sandbox.prefix / ".installed-spec").read_text(encoding="utf-8") == f"{artifact.as_uri()}#sha256={digest}\n"
    venv_python = sandbox.prefix / "current" / "bin" / "python"
    probe = subprocess.run(
        [
            str(venv_python),
            "-c",
            "import sys, importlib.metadata as m, azure.servicebus, azure.identity; "
            "print('%d.%d' % sys.version_info[:2], m.version('maintenance-bridge'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert probe.stdout.split()[0] == expected
    # AND the interpreter's own site-packages gained nothing (no agent, wire, functions, simulator there)
    after = sorted(p.name for p in Path(site).iterdir()) if Path(site).exists() else []
    assert after == before
    # AND the download and pex's scratch space are gone
    assert [p.name for p in sandbox.prefix.iterdir() if p.name.startswith(".download")] == []


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_installer_refuses_an_artifact_whose_sha256_differs(
    sandbox: Sandbox, artifacts: tuple[Path, Path], tmp_path: Path
) -> None:
    # GIVEN a file at the URL that is not the one whose hash install.env names
    tampered = tmp_path / artifacts[0].name
    tampered.write_bytes(artifacts[0].read_bytes() + b"\n")
    expected = hashlib.sha256(artifacts[0].read_bytes()).hexdigest()
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\nMBRIDGE_TRANSPORT=jsonl\n", encoding="utf-8")
    (sandbox.etc / "install.env").write_text(
        f"MBRIDGE_PACKAGE={tampered.as_uri()}\nMBRIDGE_PACKAGE_SHA256={expected}\n", encoding="utf-8"
    )
    # WHEN the installer runs
    result = sandbox.run(INSTALLER, "--unit", str(UNIT))
    # THEN it refuses before running anything from the file, naming both hashes
    assert result.returncode == 1
    assert f"has SHA-256 {hashlib.sha256(tampered.read_bytes()).hexdigest()}, not the {expected}" in result.stderr
    assert "nothing was run from it" in result.stderr
    assert not (sandbox.prefix / "current").exists()
    assert list((sandbox.prefix / "venvs").iterdir()) == []
    assert sandbox.systemctl() == []
