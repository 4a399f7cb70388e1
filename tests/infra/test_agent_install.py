"""The agent's installation on VMs (infra/agent/): the systemd unit, the Linux installer, the
Azure cloud-init, the GCE startup script, the Windows installer and the configuration examples.

GIVEN the files under infra/agent/
WHEN  they are parsed, rendered the way the Bicep and the Terraform render them, or run in a
      scratch root with stand-ins for systemctl, useradd, chown and runuser
THEN  the unit is hardened, the installer takes only a pinned version or a wheel with its SHA-256,
      installs, checks, starts and stays idempotent, the custom data carries the real files, the
      startup script reads exactly its four attributes, every example configures the agent
      with variables it really reads, and the Windows installer (read as text: no PowerShell runs
      here) takes the packages the Linux one takes, checks the artifact's SHA-256 before it runs
      it, and makes the virtualenv with pex's own tool and the same flags, without pip.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomllib
import yaml

from agent.config import settings_from_args
from mbridge.cli import build_parser
from simulator import Simulator
from tests.infra.sources import AGENT_INSTALL, REPO_ROOT
from tests.peers import require_peer

UNIT = AGENT_INSTALL / "mbridge-agent.service"
INSTALLER = AGENT_INSTALL / "install-agent.sh"
CLOUD_INIT = AGENT_INSTALL / "cloud-init.yaml"
GCE_STARTUP = AGENT_INSTALL / "gce-startup.sh"
WINDOWS = AGENT_INSTALL / "install-agent.ps1"
EXAMPLES = AGENT_INSTALL / "examples"

# The literal placeholders the Bicep and the Terraform replace, by the file cloud-init writes.
PLACEHOLDERS = {
    "/etc/mbridge/agent.env": "@@AGENT_ENV_B64@@",
    "/etc/mbridge/install.env": "@@INSTALL_ENV_B64@@",
    "/etc/systemd/system/mbridge-agent.service": "@@AGENT_UNIT_B64@@",
    "/usr/local/sbin/mbridge-install": "@@INSTALL_SCRIPT_B64@@",
}
# The instance metadata attributes gce-startup.sh reads, by the file it writes.
GCE_ATTRIBUTES = {
    "/etc/mbridge/agent.env": "mbridge-agent-env",
    "/etc/mbridge/install.env": "mbridge-package",
    "/etc/systemd/system/mbridge-agent.service": "mbridge-agent-unit",
    "/usr/local/sbin/mbridge-install": "mbridge-install-script",
}
# Azure: "The maximum length of the binary array is 65535 bytes" (osProfile.customData).
AZURE_CUSTOM_DATA_LIMIT = 65535
# Variables that the agent does not parse itself but that the libraries it loads read.
LIBRARY_VARIABLES = {
    "AZURE_CLIENT_ID",  # azure-identity: the client id of a user-assigned managed identity
    "GOOGLE_APPLICATION_CREDENTIALS",  # google-auth: a credentials file outside GCE
    "PUBSUB_EMULATOR_HOST",  # wire/transports/pubsub.py: talk to the Pub/Sub emulator
}


# ---------------------------------------------------------------- parsers


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values in order]}}: keys may repeat in systemd."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: continuation lines are not parsed here"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}:{number}: a setting before the first [section]"
        assert "=" in line, f"{path.name}:{number}: not KEY=value: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def single(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key)
    assert values is not None, f"{key}= is missing"
    assert len(values) == 1, f"{key}= is set {len(values)} times: {values}"
    return values[0]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines the way systemd's EnvironmentFile= (and install-agent.sh) read them."""
    found: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: a line without '=': {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        assert key.strip() not in found, f"{path.name}: {key} is set twice"
        found[key.strip()] = value
    return found


def commented_assignments(path: Path) -> set[str]:
    """Names in commented-out suggestions such as `# MBRIDGE_DRY_RUN=true`."""
    return set(re.findall(r"^#\s*([A-Z][A-Z0-9_]*)=", path.read_text(encoding="utf-8"), flags=re.MULTILINE))


def agent_arguments(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, *, validate: bool = True
) -> dict[str, object]:
    """`mbridge agent`'s parsed options with exactly `environ` as its MBRIDGE_* environment."""
    for name in list(os.environ):
        if name.startswith("MBRIDGE_"):
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = build_parser("agent").parse_args(["agent"])
    if validate:
        settings_from_args(args)  # raises ConfigError for a combination the agent refuses
    return vars(args)


def option_of(variable: str) -> str:
    """MBRIDGE_SERVICEBUS_NAMESPACE -> servicebus_namespace (the option's dest)."""
    assert variable.startswith("MBRIDGE_"), variable
    return variable[len("MBRIDGE_") :].lower()


def assert_agent_reads(variables: set[str], monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    options = agent_arguments({}, monkeypatch, validate=False)
    for variable in sorted(variables):
        if variable in LIBRARY_VARIABLES:
            continue
        assert variable.startswith("MBRIDGE_"), f"{where}: {variable} is read by neither the agent nor its libraries"
        assert option_of(variable) in options, f"{where}: `mbridge agent` has no option read from {variable}"


# ---------------------------------------------------------------- the unit


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return read_unit(UNIT)


def test_unit_runs_the_venv_agent_as_the_static_mbridge_user(unit: dict[str, dict[str, list[str]]]) -> None:
    # GIVEN the unit's [Service] section
    service = unit["Service"]
    # THEN it runs the installer's virtualenv as mbridge, configured by agent.env
    assert single(service, "Type") == "simple"  # the agent sends no sd_notify READY=1
    assert single(service, "User") == "mbridge"
    assert single(service, "Group") == "mbridge"
    assert "DynamicUser" not in service
    assert single(service, "ExecStart") == "/opt/mbridge/bin/mbridge agent"
    # no "-" prefix: a missing agent.env must fail the start, not run an unconfigured agent
    assert single(service, "EnvironmentFile") == "/etc/mbridge/agent.env"
    assert "MBRIDGE_STATE_DIR=/var/lib/mbridge" in service["Environment"]
    assert single(service, "StateDirectory") == "mbridge"
    assert single(service, "StateDirectoryMode") == "0700"


def test_unit_keeps_what_the_agent_writes_to_itself_and_the_installer_agrees(
    unit: dict[str, dict[str, list[str]]],
) -> None:
    # GIVEN the unit's modes for the files and directories the agent writes
    service = unit["Service"]
    # THEN all of it is mbridge's (and root's) only: no group, since the mbridge group reads
    # agent.env and its connection string; shippers tailing the jsonl file run as root
    assert single(service, "UMask") == "0077"
    assert single(service, "StateDirectoryMode") == "0700"
    assert single(service, "LogsDirectoryMode") == "0700"
    # AND the installer, which creates both directories before systemd does, and runs the check
    # as mbridge, uses the same modes
    installer = INSTALLER.read_text(encoding="utf-8")
    assert 'chmod 0700 "$STATE_DIR" "$LOG_DIR"' in installer
    assert "umask 077 && timeout 200 runuser" in installer
    assert not re.search(r"chmod 07[1-7]0 .*LOG_DIR", installer)
    # AND the documents say the same
    readme = (AGENT_INSTALL / "README.md").read_text(encoding="utf-8")
    assert "`/var/log/mbridge` (a jsonl file, 0700)" in readme
    assert "mbridge:mbridge 0700, the file 0600" in (EXAMPLES / "jsonl.env").read_text(encoding="utf-8")
    for text in (readme, (EXAMPLES / "jsonl.env").read_text(encoding="utf-8"), UNIT.read_text(encoding="utf-8")):
        assert "shipper in the mbridge group" not in text


def test_unit_restarts_for_ever_and_gives_the_outbox_time_to_flush(unit: dict[str, dict[str, list[str]]]) -> None:
    service = unit["Service"]
    assert single(service, "Restart") == "always"
    assert single(service, "RestartSec") == "2s"
    # In [Unit]: a start limit would leave the agent failed after a burst of crashes.
    assert single(unit["Unit"], "StartLimitIntervalSec") == "0"
    # SIGTERM gives the publisher up to 10 s: the stop timeout must be longer.
    timeout = single(service, "TimeoutStopSec")
    assert timeout.endswith("s")
    assert int(timeout[:-1]) > 10


def test_unit_waits_for_the_network_and_starts_at_boot(unit: dict[str, dict[str, list[str]]]) -> None:
    assert "network-online.target" in unit["Unit"]["After"]
    assert "network-online.target" in unit["Unit"]["Wants"]
    assert single(unit["Install"], "WantedBy") == "multi-user.target"


HARDENING = {
    "NoNewPrivileges": "true",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectSystem": "strict",
    "ProtectHome": "true",
    "PrivateTmp": "true",
    "PrivateDevices": "true",
    "ProtectKernelTunables": "true",
    "ProtectKernelModules": "true",
    "ProtectKernelLogs": "true",
    "ProtectControlGroups": "true",
    "ProtectClock": "true",
    "ProtectHostname": "true",
    "RestrictNamespaces": "true",
    "RestrictRealtime": "true",
    "RestrictSUIDSGID": "true",
    "LockPersonality": "true",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "@system-service",
}


@pytest.mark.parametrize(("key", "value"), sorted(HARDENING.items()))
def test_unit_is_sandboxed(unit: dict[str, dict[str, list[str]]], key: str, value: str) -> None:
    # an empty CapabilityBoundingSet= is "no capability at all", not "unset"
    assert single(unit["Service"], key) == value


def test_unit_allows_only_the_socket_families_the_agent_uses(unit: dict[str, dict[str, list[str]]]) -> None:
    families = set(single(unit["Service"], "RestrictAddressFamilies").split())
    assert families == {"AF_INET", "AF_INET6", "AF_UNIX"}


def test_unit_bounds_memory_and_tasks(unit: dict[str, dict[str, list[str]]]) -> None:
    memory = single(unit["Service"], "MemoryMax")
    assert re.fullmatch(r"\d+M", memory)
    assert 128 <= int(memory[:-1]) <= 1024
    assert 32 <= int(single(unit["Service"], "TasksMax")) <= 512


def test_unit_explains_why_memory_deny_write_execute_is_off(unit: dict[str, dict[str, list[str]]]) -> None:
    # GIVEN the decision not to set MemoryDenyWriteExecute (cffi/ctypes callbacks need W+X memory)
    assert unit["Service"].get("MemoryDenyWriteExecute", ["no"]) in (["no"], ["false"])
    # THEN a comment next to it says why
    comments = [line for line in UNIT.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    explanation = " ".join(line for line in comments if "MemoryDenyWriteExecute" in line or "cffi" in line)
    assert "MemoryDenyWriteExecute" in explanation
    assert "cffi" in explanation


def test_systemd_knows_every_key_of_the_unit(tmp_path: Path) -> None:
    require_peer(shutil.which("systemd-analyze") is not None, "systemd-analyze is not installed (apt: systemd)")
    # GIVEN the unit in a directory of its own (ExecStart's binary does not exist here)
    shutil.copy(UNIT, tmp_path / UNIT.name)
    # WHEN systemd's own parser verifies it
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / UNIT.name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # THEN it complains about nothing but the missing binary: no unknown key, no bad value
    complaints = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if UNIT.name in line and "/opt/mbridge/bin/mbridge" not in line
    ]
    assert complaints == []
    assert not re.search(r"Unknown (key|section)|[Ii]nvalid|Failed to parse", result.stderr)


def _offline_security_supported() -> bool:
    if shutil.which("systemd-analyze") is None:
        return False
    help_text = subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True, check=False).stdout
    return "--offline" in help_text


def test_systemd_rates_the_unit_exposure_ok(tmp_path: Path) -> None:
    require_peer(_offline_security_supported(), "needs systemd-analyze security --offline (systemd 250+)")
    shutil.copy(UNIT, tmp_path / UNIT.name)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(tmp_path / UNIT.name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    # 0 is a perfect sandbox, 10 none; "OK" starts below 4.0. Network access costs about one point.
    assert float(match.group(1)) <= 2.5


# ---------------------------------------------------------------- cloud-init


def test_cloud_init_is_cloud_config_with_each_placeholder_once_in_its_entry() -> None:
    # GIVEN cloud-init.yaml as the Bicep and the Terraform read it
    text = CLOUD_INIT.read_text(encoding="utf-8")
    # THEN it is #cloud-config YAML
    assert text.splitlines()[0] == "#cloud-config"
    document = yaml.safe_load(text)
    # AND every placeholder occurs exactly once (replace() substitutes every occurrence)
    for placeholder in PLACEHOLDERS.values():
        assert text.count(placeholder) == 1, placeholder
    # AND it is the content of its file's entry, base64-encoded
    entries = {entry["path"]: entry for entry in document["write_files"]}
    assert set(entries) == set(PLACEHOLDERS)
    for path, placeholder in PLACEHOLDERS.items():
        assert entries[path]["content"] == placeholder
        assert entries[path]["encoding"] == "b64"
        assert entries[path]["owner"] == "root:root"
    assert entries["/etc/mbridge/agent.env"]["permissions"] == "0640"
    assert entries["/usr/local/sbin/mbridge-install"]["permissions"] == "0755"
    # AND it runs the installer it wrote
    assert ["/usr/local/sbin/mbridge-install"] in document["runcmd"]


def test_rendered_cloud_init_writes_the_real_files_within_azure_custom_data_limit() -> None:
    # GIVEN the real files, base64-encoded into the placeholders as the Bicep/Terraform do
    contents = {
        "/etc/mbridge/agent.env": (EXAMPLES / "azure-servicebus.env").read_bytes(),
        "/etc/mbridge/install.env": (
            b"MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus] @ https://example.blob.core.windows.net/agent/"
            b"maintenance_bridge-0.1.0-py3-none-any.whl\nMBRIDGE_PACKAGE_SHA256=" + b"0" * 64 + b"\n"
        ),
        "/etc/systemd/system/mbridge-agent.service": UNIT.read_bytes(),
        "/usr/local/sbin/mbridge-install": INSTALLER.read_bytes(),
    }
    rendered = CLOUD_INIT.read_text(encoding="utf-8")
    for path, placeholder in PLACEHOLDERS.items():
        rendered = rendered.replace(placeholder, base64.b64encode(contents[path]).decode("ascii"))
    # WHEN cloud-init parses it
    document = yaml.safe_load(rendered)
    # THEN each file decodes to exactly the original bytes
    for entry in document["write_files"]:
        assert base64.b64decode(entry["content"], validate=True) == contents[entry["path"]]
    # AND the custom data stays within Azure's limit (with room for a longer agent.env)
    assert rendered.startswith("#cloud-config\n")
    assert len(rendered.encode("utf-8")) < AZURE_CUSTOM_DATA_LIMIT - 8192


# ---------------------------------------------------------------- shell syntax


@pytest.mark.parametrize("script", [INSTALLER, GCE_STARTUP], ids=lambda p: p.name)
def test_shell_scripts_parse_with_bash(script: Path) -> None:
    assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", [INSTALLER, GCE_STARTUP], ids=lambda p: p.name)
def test_shell_scripts_pass_shellcheck(script: Path) -> None:
    require_peer(shutil.which("shellcheck") is not None, "shellcheck is not installed (apt: shellcheck)")
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------- what a VM installs

# The function apps' libraries, which a VM must not install with the agent.
FUNCTION_APP_LIBRARIES = (
    "azure-functions",
    "azure-mgmt-",
    "azure-data-tables",
    "google-cloud-compute",
    "google-cloud-firestore",
    "functions-framework",
    "cloudevents",
)
AGENT_EXTRAS = ("agent-servicebus", "agent-pubsub")


def installer_agent_extras() -> set[str]:
    match = re.search(r'^AGENT_EXTRAS="([^"]*)"$', INSTALLER.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert match, "install-agent.sh does not list AGENT_EXTRAS"
    return set(match.group(1).split())


def test_the_agent_extras_hold_the_bus_clients_and_no_function_app_library() -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert installer_agent_extras() == set(AGENT_EXTRAS)
    for name in AGENT_EXTRAS:
        requirements = [re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in extras[name]]
        assert requirements, name
        for requirement in requirements:
            assert not requirement.startswith(FUNCTION_APP_LIBRARIES), f"[{name}] pulls in {requirement}"
    assert {"azure-servicebus", "azure-identity"} <= {r.split(">")[0] for r in extras["agent-servicebus"]}
    assert {"google-cloud-pubsub"} <= {r.split(">")[0] for r in extras["agent-pubsub"]}


@pytest.mark.parametrize(
    "path", [INSTALLER, CLOUD_INIT, GCE_STARTUP, AGENT_INSTALL / "README.md"], ids=lambda p: p.name
)
def test_the_installation_files_name_only_the_agent_extras(path: Path) -> None:
    # [functions-azure] and [functions-gcp] are the function apps' extras: a VM following these files never gets them
    assert not re.search(r"maintenance-bridge\[(azure|gcp)\]", path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the installer in a scratch root

# Stand-ins for the commands that change the system. Each logs its command line; useradd and
# groupadd remember the name, which getent then finds; runuser runs the command as the caller.
FAKES = {
    "systemctl": 'echo "systemctl $*" >> "$FAKE_DIR/calls"\n[ "$1" != is-active ] || exit "${FAKE_IS_ACTIVE:-0}"',
    "useradd": 'echo "useradd $*" >> "$FAKE_DIR/calls"\nfor last; do :; done\necho "$last" >> "$FAKE_DIR/passwd"',
    "groupadd": 'echo "groupadd $*" >> "$FAKE_DIR/calls"\nfor last; do :; done\necho "$last" >> "$FAKE_DIR/group"',
    "userdel": 'echo "userdel $*" >> "$FAKE_DIR/calls"',
    "groupdel": 'echo "groupdel $*" >> "$FAKE_DIR/calls"',
    "chown": 'echo "chown $*" >> "$FAKE_DIR/calls"',
    "getent": 'grep -qx "$2" "$FAKE_DIR/$1" 2>/dev/null || exit 2\necho "$2:x:990:990::/nonexistent:/usr/sbin/nologin"',
    "runuser": 'echo "runuser $*" >> "$FAKE_DIR/calls"\n'
    'while [ "$#" -gt 0 ]; do case "$1" in --) shift; break ;; *) shift ;; esac; done\nexec "$@"',
    "logger": "exit 0",
}


@dataclass
class Sandbox:
    root: Path
    fakes: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "mbridge"

    @property
    def prefix(self) -> Path:
        return self.root / "opt" / "mbridge"

    def run(self, script: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MBRIDGE_")},
            "PATH": f"{self.fakes}{os.pathsep}{os.environ['PATH']}",
            "FAKE_DIR": str(self.fakes),
            "MBRIDGE_INSTALL_ROOT": str(self.root),
            "MBRIDGE_INSTALL_SETTLE_SECONDS": "0",
            "MBRIDGE_PYTHON": sys.executable,
            **self.extra_env,
        }
        return subprocess.run(
            ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def calls(self) -> list[str]:
        log = self.fakes / "calls"
        return log.read_text(encoding="utf-8").splitlines() if log.exists() else []

    def systemctl(self) -> list[str]:
        return [call[len("systemctl ") :] for call in self.calls() if call.startswith("systemctl ")]

    def forget_calls(self) -> None:
        (self.fakes / "calls").unlink(missing_ok=True)


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


@pytest.fixture(scope="module")
def package_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's package sources: pip builds in the source tree, not in the repository."""
    target = tmp_path_factory.mktemp("source") / "maintenance-bridge"
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, target / name)
    for package in ("wire", "agent", "functions", "simulator", "mbridge"):
        shutil.copytree(REPO_ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str

    @property
    def url(self) -> str:
        return self.path.as_uri()


@pytest.fixture(scope="module")
def wheel(package_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """The project's wheel, built the way docs/deploy.md builds the one VMs download."""
    target = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(target), str(package_source)],
        check=True,
        timeout=240,
    )
    [path] = target.glob("maintenance_bridge-*.whl")
    return Wheel(path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def private_index(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PEP 503 index in a directory, serving the wheel and its dependencies: the private index
    a pinned version comes from (a file:// index URL is read like an https:// one)."""
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(files), str(wheel.path)],
        check=True,
        timeout=240,
    )
    for path in files.iterdir():
        project = re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        with page.open("a", encoding="utf-8") as out:
            out.write(f'<a href="{path.as_uri()}#sha256={digest}">{path.name}</a>\n')
    return (root / "simple").as_uri() + "/"


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    """Azure Scheduled Events for the VM web-0, served by the project's simulator."""
    with Simulator(cloud="azure", vm_names=["web-0"]) as sim:
        yield sim.base_urls[0]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_installer_prints_usage_and_rejects_unknown_arguments(sandbox: Sandbox) -> None:
    shown = sandbox.run(INSTALLER, "--help")
    assert shown.returncode == 0
    assert shown.stdout.startswith("Usage: install-agent.sh")
    wrong = sandbox.run(INSTALLER, "--colour")
    assert wrong.returncode == 64
    assert "unknown argument: --colour" in wrong.stderr
    assert sandbox.run(INSTALLER, "--purge").returncode == 64  # only with --uninstall
    assert sandbox.calls() == []


def test_installer_without_package_spec_says_where_to_put_it(sandbox: Sandbox) -> None:
    # GIVEN agent settings but no install.env
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\n", encoding="utf-8")
    # WHEN the installer runs
    result = sandbox.run(INSTALLER)
    # THEN it fails before touching anything, naming the variable and the file
    assert result.returncode == 1
    assert "MBRIDGE_PACKAGE" in result.stderr
    assert "install.env" in result.stderr
    assert sandbox.calls() == []


def test_installer_without_agent_settings_says_so(sandbox: Sandbox) -> None:
    (sandbox.etc / "install.env").write_text("MBRIDGE_PACKAGE=maintenance-bridge\n", encoding="utf-8")
    result = sandbox.run(INSTALLER)
    assert result.returncode == 1
    assert "agent.env is missing" in result.stderr
    assert sandbox.calls() == []


SHA256_A = "a" * 64
# install.env contents the installer refuses before it changes anything, with what it says.
REFUSED_PACKAGES = {
    "a bare name": ("MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]\n", "is not pinned"),
    "a range": ("MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]>=0.1\n", "is not pinned to one version"),
    "a wildcard": ("MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==0.*\n", "does not pin one version"),
    "a pin without its index": (
        "MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==0.1.0\n",
        "PIP_INDEX_URL is not set",
    ),
    "a pin from PyPI": (
        "MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==0.1.0\nPIP_INDEX_URL=https://pypi.org/simple\n",
        "PIP_INDEX_URL is PyPI",
    ),
    "a pin with a second index": (
        "MBRIDGE_PACKAGE=maintenance-bridge[agent-pubsub]==0.1.0\nPIP_INDEX_URL=https://pypi.example.internal/simple\n"
        "PIP_EXTRA_INDEX_URL=https://mirror.example.internal/simple\n",
        "PIP_EXTRA_INDEX_URL is set",
    ),
    "the function apps' extra": (
        "MBRIDGE_PACKAGE=maintenance-bridge[functions-azure]==0.1.0\n",
        "extra [functions-azure]",
    ),
    "another package": ("MBRIDGE_PACKAGE=maintenance-bridges==0.1.0\n", "not maintenance-bridge"),
    "a wheel URL without its hash": (
        "MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus] @ https://example.com/maintenance_bridge-0.1.0-py3-none-any.whl\n",
        "has no SHA-256",
    ),
    "two different hashes": (
        "MBRIDGE_PACKAGE=https://example.com/maintenance_bridge-0.1.0-py3-none-any.whl#sha256=" + "b" * 64 + "\n"
        f"MBRIDGE_PACKAGE_SHA256={SHA256_A}\n",
        "differ",
    ),
    "a source tree": ("MBRIDGE_PACKAGE=/srv/maintenance-bridge\n", "is not a requirement this installer takes"),
}


@pytest.mark.parametrize(("install_env", "reason"), REFUSED_PACKAGES.values(), ids=REFUSED_PACKAGES.keys())
def test_installer_refuses_a_package_that_is_not_pinned_and_says_what_to_set(
    sandbox: Sandbox, install_env: str, reason: str
) -> None:
    # GIVEN agent settings and an install.env that does not name one exact package
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\n", encoding="utf-8")
    (sandbox.etc / "install.env").write_text(install_env, encoding="utf-8")
    # (install.env alone decides the index, whatever the machine running the tests uses)
    sandbox.extra_env.update({"PIP_INDEX_URL": "", "PIP_EXTRA_INDEX_URL": ""})
    # WHEN the installer runs
    result = sandbox.run(INSTALLER)
    # THEN it refuses before touching anything, saying why and what to set instead
    assert result.returncode == 1
    assert reason in result.stderr
    for setting in (
        "MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==X.Y.Z",
        "PIP_INDEX_URL=",
        "MBRIDGE_PACKAGE_SHA256=",
    ):
        assert setting in result.stderr
    assert sandbox.calls() == []
    assert not sandbox.prefix.exists()


@pytest.mark.slow
def test_installer_installs_a_pinned_version_from_the_index_install_env_names(
    sandbox: Sandbox, private_index: str
) -> None:
    # GIVEN a pinned version and the private index that serves it (and its dependencies)
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\nMBRIDGE_TRANSPORT=jsonl\n", encoding="utf-8")
    (sandbox.etc / "install.env").write_text(
        f"MBRIDGE_PACKAGE=maintenance-bridge==0.1.0\nPIP_INDEX_URL={private_index}\n", encoding="utf-8"
    )
    sandbox.extra_env["PIP_EXTRA_INDEX_URL"] = ""
    # WHEN the installer runs
    result = sandbox.run(INSTALLER, "--unit", str(UNIT), "--no-check")
    # THEN pip installed exactly that version from that index
    assert result.returncode == 0, result.stderr
    assert (sandbox.prefix / ".installed-spec").read_text(encoding="utf-8") == "maintenance-bridge==0.1.0\n"
    version = subprocess.run(
        [
            str(sandbox.prefix / "current/bin/python"),
            "-c",
            "import importlib.metadata as m; print(m.version('maintenance-bridge'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout == "0.1.0\n"


@pytest.mark.slow
def test_installer_lets_pip_refuse_a_wheel_whose_sha256_differs(sandbox: Sandbox, wheel: Wheel) -> None:
    # GIVEN a wheel URL with a SHA-256 that is not the wheel's
    (sandbox.etc / "agent.env").write_text("MBRIDGE_CLOUD=azure\nMBRIDGE_TRANSPORT=jsonl\n", encoding="utf-8")
    (sandbox.etc / "install.env").write_text(
        f"MBRIDGE_PACKAGE=maintenance-bridge @ {wheel.url}\nMBRIDGE_PACKAGE_SHA256={SHA256_A}\n", encoding="utf-8"
    )
    # WHEN the installer runs
    result = sandbox.run(INSTALLER, "--unit", str(UNIT), "--no-check")
    # THEN pip refuses the download, naming both hashes, and nothing is installed or started
    assert result.returncode == 1
    assert "DO NOT MATCH THE HASHES" in result.stderr
    assert f"Expected sha256 {SHA256_A}" in result.stderr
    assert wheel.sha256 in result.stderr
    assert not (sandbox.prefix / "current").exists()
    assert list((sandbox.prefix / "venvs").iterdir()) == []
    assert sandbox.systemctl() == []


@pytest.mark.slow
def test_installer_installs_checks_starts_and_reruns_idempotently(
    sandbox: Sandbox, wheel: Wheel, metadata_url: str
) -> None:
    # GIVEN the files cloud-init writes: settings for web-0 (the simulator stands in for IMDS)
    # and the package: the project's wheel by URL, with its SHA-256
    agent_env = sandbox.etc / "agent.env"
    agent_env.write_text(
        f'# web-0\nMBRIDGE_CLOUD=azure\nMBRIDGE_METADATA_URL="{metadata_url}"\n'
        "MBRIDGE_TRANSPORT=jsonl\nMBRIDGE_VERIFY_KEY=\n",
        encoding="utf-8",
    )
    (sandbox.etc / "install.env").write_text(
        f"MBRIDGE_PACKAGE=maintenance-bridge @ {wheel.url}\nMBRIDGE_PACKAGE_SHA256={wheel.sha256.upper()}\n",
        encoding="utf-8",
    )
    # what pip is given: the hash as the URL's #sha256= fragment, which pip checks
    spec = f"maintenance-bridge @ {wheel.url}#sha256={wheel.sha256}"

    # WHEN the installer runs the first time, given the unit as an argument
    first = sandbox.run(INSTALLER, "--unit", str(UNIT))

    # THEN it succeeds with a working mbridge where the unit's ExecStart looks for it
    assert first.returncode == 0, first.stderr
    exec_start = single(read_unit(UNIT)["Service"], "ExecStart").split()[0]
    mbridge = sandbox.root / exec_start.lstrip("/")
    assert subprocess.run([str(mbridge), "--help"], capture_output=True, check=False).returncode == 0
    assert (sandbox.prefix / ".installed-spec").read_text(encoding="utf-8") == f"{spec}\n"
    installed_unit = sandbox.root / "etc/systemd/system/mbridge-agent.service"
    assert installed_unit.read_bytes() == UNIT.read_bytes()
    # AND the system user exists, made for a service: no login, no home
    calls = sandbox.calls()
    assert "groupadd --system mbridge" in calls
    [useradd] = [call for call in calls if call.startswith("useradd ")]
    assert "--system" in useradd
    assert "--no-create-home" in useradd
    assert "nologin" in useradd
    assert useradd.endswith(" mbridge")
    # AND the settings are readable by the agent's group only; install.env by root only
    assert f"chown root:mbridge {agent_env}" in calls
    assert mode(agent_env) == 0o640
    assert mode(sandbox.etc / "install.env") == 0o600
    assert mode(sandbox.root / "var/lib/mbridge") == 0o700
    assert mode(sandbox.root / "var/log/mbridge") == 0o700
    # AND the real `mbridge agent --check` ran as mbridge, with the unit's state directory, and passed
    [check] = [call for call in calls if call.startswith("runuser ")]
    assert check.startswith("runuser -u mbridge -- env -i ")
    assert f"MBRIDGE_STATE_DIR={sandbox.root}/var/lib/mbridge" in check
    assert f"MBRIDGE_METADATA_URL={metadata_url} " in check  # quotes removed, as systemd does
    assert "this VM's name: web-0" in first.stderr
    assert "check: healthy" in first.stderr
    # AND systemd loaded, enabled and (re)started the unit
    assert sandbox.systemctl() == [
        "daemon-reload",
        "enable --quiet mbridge-agent.service",
        "restart mbridge-agent.service",
        "is-active --quiet mbridge-agent.service",
    ]

    # WHEN it runs again with nothing changed (as at a reboot; the unit is in place now)
    current = os.readlink(sandbox.prefix / "current")
    sandbox.forget_calls()
    second = sandbox.run(INSTALLER)
    # THEN it neither reinstalls, nor recreates the user, nor restarts: it only makes sure it runs
    assert second.returncode == 0, second.stderr
    assert "already installed; skipping pip" in second.stderr
    assert os.readlink(sandbox.prefix / "current") == current
    assert not any(call.startswith(("useradd", "groupadd")) for call in sandbox.calls())
    assert sandbox.systemctl() == [
        "daemon-reload",
        "enable --quiet mbridge-agent.service",
        "start mbridge-agent.service",
        "is-active --quiet mbridge-agent.service",
    ]

    # WHEN only agent.env changed
    agent_env.write_text(agent_env.read_text(encoding="utf-8") + "MBRIDGE_LOG_LEVEL=DEBUG\n", encoding="utf-8")
    sandbox.forget_calls()
    third = sandbox.run(INSTALLER)
    # THEN the agent is restarted with the same installation
    assert third.returncode == 0, third.stderr
    assert "already installed; skipping pip" in third.stderr
    assert "restart mbridge-agent.service" in sandbox.systemctl()

    # WHEN a new package cannot be installed (its hash is not the wheel's)
    sandbox.forget_calls()
    broken = sandbox.run(INSTALLER, "--package", f"maintenance-bridge @ {wheel.url}#sha256={SHA256_A}")
    # THEN the installer fails and the running installation is untouched and not restarted
    assert broken.returncode == 1
    assert "DO NOT MATCH THE HASHES" in broken.stderr
    assert "the previous installation, if any, is unchanged" in broken.stderr
    assert os.readlink(sandbox.prefix / "current") == current
    assert sorted(p.name for p in (sandbox.prefix / "venvs").iterdir()) == [Path(current).name]
    assert (sandbox.prefix / ".installed-spec").read_text(encoding="utf-8") == f"{spec}\n"
    assert sandbox.systemctl() == []

    # WHEN agent.env has a configuration error the agent refuses (no MBRIDGE_CLOUD)
    agent_env.write_text("MBRIDGE_TRANSPORT=jsonl\n", encoding="utf-8")
    sandbox.forget_calls()
    refused = sandbox.run(INSTALLER)
    # THEN the installer says so and does not (re)start an agent that cannot run
    assert refused.returncode == 1
    assert "mbridge agent: cloud (--cloud / MBRIDGE_CLOUD / config key cloud): not set" in refused.stderr
    assert "configuration error" in refused.stderr
    assert sandbox.systemctl() == []

    # WHEN it uninstalls with --purge
    sandbox.forget_calls()
    removed = sandbox.run(INSTALLER, "--uninstall", "--purge")
    # THEN the service, the code, the settings and the user are gone
    assert removed.returncode == 0, removed.stderr
    assert sandbox.systemctl()[:1] == ["disable --now mbridge-agent.service"]
    assert not sandbox.prefix.exists()
    assert not sandbox.etc.exists()
    assert not installed_unit.exists()
    assert "userdel mbridge" in sandbox.calls()


# ---------------------------------------------------------------- the GCE startup script


@dataclass
class FakeMetadataServer:
    """The GCE metadata server's instance attributes; `failures` answers these statuses first."""

    attributes: dict[str, str]
    failures: dict[str, list[int]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = self.path.rsplit("/", 1)[-1]
                server.requests.append((key, self.headers.get("Metadata-Flavor")))
                pending = server.failures.get(key, [])
                if pending:
                    self._answer(pending.pop(0), b"busy")
                elif self.headers.get("Metadata-Flavor") != "Google":
                    self._answer(403, b"missing Metadata-Flavor:Google header")
                elif key in server.attributes:
                    self._answer(200, server.attributes[key].encode("utf-8"))
                else:
                    self._answer(404, b"not found")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


@pytest.fixture
def metadata_server() -> Iterator[tuple[FakeMetadataServer, str]]:
    fake = FakeMetadataServer(attributes={})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{httpd.server_address[1]}/computeMetadata/v1/instance/attributes"
    finally:
        httpd.shutdown()
        httpd.server_close()


STUB_INSTALLER = '#!/bin/sh\necho "installed under $MBRIDGE_INSTALL_ROOT" > "$MBRIDGE_INSTALL_ROOT/installer-ran"\n'


# One attribute carries no index setting: the wheel URL with its hash.
GCE_PACKAGE = (
    "maintenance-bridge[agent-pubsub] @ https://storage.googleapis.com/my-bucket/maintenance_bridge-0.1.0-py3-none-any.whl"
    "#sha256=" + "0" * 64
)


def gce_attributes(installer: str = STUB_INSTALLER) -> dict[str, str]:
    return {
        "mbridge-agent-env": (EXAMPLES / "gce-pubsub.env").read_text(encoding="utf-8"),
        "mbridge-package": f"{GCE_PACKAGE}\n",
        "mbridge-agent-unit": UNIT.read_text(encoding="utf-8"),
        "mbridge-install-script": installer,
    }


def test_gce_startup_writes_its_four_attributes_and_runs_the_installer(
    sandbox: Sandbox, metadata_server: tuple[FakeMetadataServer, str]
) -> None:
    # GIVEN instance metadata with the four attributes
    fake, url = metadata_server
    fake.attributes.update(gce_attributes())
    sandbox.extra_env["MBRIDGE_STARTUP_METADATA_URL"] = url
    # WHEN the startup script runs
    result = sandbox.run(GCE_STARTUP)
    # THEN it read exactly those four keys, always with the Metadata-Flavor header
    assert result.returncode == 0, result.stderr
    assert {key for key, _ in fake.requests} == set(GCE_ATTRIBUTES.values())
    assert {flavor for _, flavor in fake.requests} == {"Google"}
    # AND wrote each where cloud-init writes it on Azure, with the same modes
    files = {path: sandbox.root / path.lstrip("/") for path in GCE_ATTRIBUTES}
    assert files["/etc/mbridge/agent.env"].read_text(encoding="utf-8") == fake.attributes["mbridge-agent-env"]
    assert files["/etc/mbridge/install.env"].read_text(encoding="utf-8") == (f"MBRIDGE_PACKAGE={GCE_PACKAGE}\n")
    assert files["/etc/systemd/system/mbridge-agent.service"].read_bytes() == UNIT.read_bytes()
    assert files["/usr/local/sbin/mbridge-install"].read_text(encoding="utf-8") == STUB_INSTALLER
    assert {path: mode(file) for path, file in files.items()} == {
        "/etc/mbridge/agent.env": 0o640,
        "/etc/mbridge/install.env": 0o600,
        "/etc/systemd/system/mbridge-agent.service": 0o644,
        "/usr/local/sbin/mbridge-install": 0o755,
    }
    # AND ran the installer it wrote
    assert (sandbox.root / "installer-ran").read_text(encoding="utf-8") == f"installed under {sandbox.root}\n"
    assert not list(sandbox.etc.glob(".startup.*")), "the scratch directory was left behind"


@pytest.mark.parametrize("missing", sorted(GCE_ATTRIBUTES.values()))
def test_gce_startup_names_a_missing_attribute_and_installs_nothing(
    sandbox: Sandbox, metadata_server: tuple[FakeMetadataServer, str], missing: str
) -> None:
    # GIVEN instance metadata without one of the attributes
    fake, url = metadata_server
    fake.attributes.update({key: value for key, value in gce_attributes().items() if key != missing})
    sandbox.extra_env["MBRIDGE_STARTUP_METADATA_URL"] = url
    # WHEN the startup script runs
    result = sandbox.run(GCE_STARTUP)
    # THEN it fails, naming the attribute, without retrying a 404 or writing any file
    assert result.returncode == 1
    assert f"instance metadata attribute '{missing}' is not set" in result.stderr
    assert [key for key, _ in fake.requests].count(missing) == 1
    assert not (sandbox.etc / "agent.env").exists()
    assert not (sandbox.root / "installer-ran").exists()


def test_gce_startup_retries_a_busy_metadata_server(
    sandbox: Sandbox, metadata_server: tuple[FakeMetadataServer, str]
) -> None:
    # GIVEN a metadata server that answers 503 once (as during maintenance)
    fake, url = metadata_server
    fake.attributes.update(gce_attributes())
    fake.failures["mbridge-package"] = [503]
    sandbox.extra_env["MBRIDGE_STARTUP_METADATA_URL"] = url
    # WHEN the startup script runs
    result = sandbox.run(GCE_STARTUP)
    # THEN it asked again and finished
    assert result.returncode == 0, result.stderr
    assert [key for key, _ in fake.requests].count("mbridge-package") == 2
    assert "HTTP 503" in result.stderr
    assert (sandbox.root / "installer-ran").exists()


def test_gce_startup_fails_when_the_installer_fails(
    sandbox: Sandbox, metadata_server: tuple[FakeMetadataServer, str]
) -> None:
    fake, url = metadata_server
    fake.attributes.update(gce_attributes(installer="#!/bin/sh\nexit 3\n"))
    sandbox.extra_env["MBRIDGE_STARTUP_METADATA_URL"] = url
    result = sandbox.run(GCE_STARTUP)
    assert result.returncode == 1
    assert "mbridge-install failed with status 3" in result.stderr


def test_gce_startup_names_only_its_four_attributes() -> None:
    # The same as the run above, read from the text: every fetch names one of the four keys.
    fetched = re.findall(r"^fetch (\S+) ", GCE_STARTUP.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert sorted(fetched) == sorted(GCE_ATTRIBUTES.values())


# ---------------------------------------------------------------- examples


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.env"))


def test_the_examples_are_the_documented_set() -> None:
    names = {path.name for path in EXAMPLE_FILES}
    assert names == {
        "azure-servicebus.env",
        "azure-servicebus-connection-string.env",
        "gce-pubsub.env",
        "local-bus.env",
        "jsonl.env",
    }
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for name in names:
        assert f"]({name})" in index, f"examples/README.md does not list {name}"


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_names_only_variables_the_agent_reads_and_is_accepted(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an example agent.env, its settings and its commented-out suggestions
    settings = read_env_file(example)
    # THEN every name is an option of `mbridge agent` (or read by a library the agent loads)
    assert_agent_reads(set(settings) | commented_assignments(example), monkeypatch, example.name)
    # AND the unit owns the state directory: an example must not move it out of the sandbox
    assert "MBRIDGE_STATE_DIR" not in settings
    # AND the agent's own parser accepts the settings and takes their values
    parsed = agent_arguments({k: v for k, v in settings.items() if k.startswith("MBRIDGE_")}, monkeypatch)
    for variable, value in settings.items():
        if variable.startswith("MBRIDGE_") and value and isinstance(parsed[option_of(variable)], str):
            assert parsed[option_of(variable)] == value, variable


def test_pubsub_emulator_variable_is_really_read_by_the_agent() -> None:
    # LIBRARY_VARIABLES lists it as the agent's own, so it must stay so
    assert '"PUBSUB_EMULATOR_HOST"' in (REPO_ROOT / "wire" / "transports" / "pubsub" / "settings.py").read_text(
        encoding="utf-8"
    )


# ---------------------------------------------------------------- Windows


def powershell_code(text: str) -> str:
    """The script without comments: <# ... #> blocks and # to the end of a line (outside strings)."""
    without_blocks = re.sub(r"<#.*?#>", "", text, flags=re.DOTALL)
    return "\n".join(line for line in without_blocks.splitlines() if not line.lstrip().startswith("#"))


def test_windows_installer_requires_the_winsw_hash_and_pins_its_release() -> None:
    text = WINDOWS.read_text(encoding="utf-8")
    # a mandatory parameter, validated as 64 hex digits, with no default value
    declaration = re.search(
        r"\[Parameter\(Mandatory = \$true, ParameterSetName = 'Install'\)\]\s*"
        r"\[ValidatePattern\('\^\[0-9A-Fa-f\]\{64\}\$'\)\]\s*\[string\] \$WinSWSha256\s*(,|\))",
        text,
    )
    assert declaration, "-WinSWSha256 must be mandatory, 64 hex digits, without a default"
    assert "https://github.com/winsw/winsw/releases/download/v2.12.0/WinSW-x64.exe" in text
    code = powershell_code(text)
    assert "Get-FileHash" in code
    assert "-Algorithm SHA256" in code
    assert re.search(r"if \(\$actual -ne \$WinSWSha256\.ToUpperInvariant\(\)\) \{\s*throw", code)


def powershell_functions(code: str) -> tuple[dict[str, str], str]:
    """The bodies of the functions of `code` (without comments) by name, and the code outside them."""
    functions: dict[str, str] = {}
    outside: list[str] = []
    position = 0
    for match in re.finditer(r"^function ([\w-]+)[^{\n]*\{", code, flags=re.MULTILINE):
        depth, end = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            end += 1
        functions[match.group(1)] = code[match.end() : end - 1]
        outside.append(code[position : match.start()])
        position = end
    outside.append(code[position:])
    return functions, "".join(outside)


def windows_install_flow() -> tuple[dict[str, str], str]:
    """The .ps1's functions, and its install flow: the code outside them from the package's resolution on."""
    functions, outside = powershell_functions(powershell_code(WINDOWS.read_text(encoding="utf-8")))
    return functions, outside[outside.index("$agentPackage = Resolve-AgentPackage") :]


def test_windows_installer_takes_only_a_pinned_package_like_the_linux_one() -> None:
    text = WINDOWS.read_text(encoding="utf-8")
    functions, flow = windows_install_flow()
    # the package is resolved (and refused) before anything is installed
    assert flow.index("$agentPackage = Resolve-AgentPackage") < flow.index("$pythonExe = Find-Python")
    # the same extras as install-agent.sh, the hash checked by pip as the URL's fragment
    extras = re.search(r"\$agentExtras = @\(([^)]*)\)", functions["Resolve-AgentPackage"])
    assert extras
    assert set(re.findall(r"'([a-z-]+)'", extras.group(1))) == set(AGENT_EXTRAS)
    assert 'Spec = "maintenance-bridge$extras @ $url#sha256=$hash"' in functions["Resolve-AgentPackage"]
    assert re.search(r"\[ValidatePattern\('\^\[0-9A-Fa-f\]\{64\}\$'\)\]\s*\[string\] \$PackageSha256", text)
    # a pinned version needs its index, which pip is given
    assert "if (-not $IndexUrl) { throw" in functions["Resolve-AgentPackage"]
    assert "@('--index-url', $IndexUrl)" in functions["Install-PipPackage"]
    # the examples install the agent's extras only
    assert not re.search(r"maintenance-bridge\[(azure|gcp)\]", text)


def linux_pattern(variable: str) -> re.Pattern[str]:
    """The bash regular expression install-agent.sh matches $variable against, as Python reads it."""
    found = re.search(rf'\[\[ "\${variable}" =~ (\S+) \]\]', INSTALLER.read_text(encoding="utf-8"))
    assert found, f"install-agent.sh does not match ${variable} against a pattern"
    return re.compile(found.group(1).replace("[^[:space:]]", r"\S"))


def windows_pattern(variable: str) -> re.Pattern[str]:
    """The case-sensitive pattern Resolve-AgentPackage refuses $variable with."""
    found = re.search(rf"\${variable} -cnotmatch '([^']+)'", windows_install_flow()[0]["Resolve-AgentPackage"])
    assert found, f"Resolve-AgentPackage does not check ${variable} case-sensitively"
    return re.compile(found.group(1))


# URLs after `@` or as the whole spec (fragment split off), and whether install-agent.sh takes them.
PACKAGE_URLS = {
    "https://example.com/agent/mbridge-agent-servicebus-0.1.0.pex": True,
    "http://10.0.0.4/mbridge-agent-pubsub-0.1.0.pex": True,
    "file:///C:/packages/mbridge-agent-0.1.0.pex": True,
    "https://example.com/maintenance_bridge-0.1.0-py3-none-any.whl": True,
    "file:///srv/maintenance_bridge-0.1.0-py3-none-any.whl": True,
    "ftp://example.com/mbridge-agent-0.1.0.pex": False,
    "HTTPS://example.com/mbridge-agent-0.1.0.pex": False,
    "https://example.com/mbridge-agent-0.1.0.PEX": False,
    "https://example.com/mbridge-agent-0.1.0.pex?sv=2024": False,
    "https://example.com/mbridge agent.pex": False,
    "https://example.com/maintenance-bridge-0.1.0.tar.gz": False,
    "C:\\packages\\mbridge-agent-0.1.0.pex": False,
}
FRAGMENTS = {
    "sha256=" + "a" * 64: True,
    "sha256=" + "A" * 64: True,
    "SHA256=" + "a" * 64: False,
    "sha256=" + "a" * 63: False,
    "md5=" + "a" * 32: False,
}


def test_windows_installer_takes_the_urls_and_hashes_the_linux_one_takes() -> None:
    # GIVEN the patterns both installers check a package URL and its #fragment with
    for variable, samples in (("url", PACKAGE_URLS), ("fragment", FRAGMENTS)):
        linux, windows = linux_pattern(variable), windows_pattern(variable)
        # WHEN they read the same samples THEN they take exactly the ones install-agent.sh is meant to take
        assert {s for s in samples if linux.search(s)} == {s for s, taken in samples.items() if taken}
        assert {s for s in samples if windows.search(s)} == {s for s, taken in samples.items() if taken}


def test_windows_installer_refuses_an_artifact_without_its_sha256_and_says_what_to_pass() -> None:
    resolve = windows_install_flow()[0]["Resolve-AgentPackage"]
    # -PackageSha256 is merged into the URL's hash before the artifact is recognised
    assert resolve.index("$hash = $PackageSha256") < resolve.index("if ($url.EndsWith('.pex')) {")
    branch = resolve[resolve.index("if ($url.EndsWith('.pex')) {") :]
    # the artifact's branch first throws without a hash, naming both ways to give one
    refusal = re.match(
        r"if \(\$url\.EndsWith\('\.pex'\)\) \{\s*if \(-not \$hash\) \{\s*throw (.*?)\}", branch, re.DOTALL
    )
    assert refusal, "an artifact without its SHA-256 must be refused first"
    assert "-PackageSha256 <hex>" in refusal.group(1)
    assert "#sha256=<hex>" in refusal.group(1)
    # then it is an artifact, its spec the one install-agent.sh records: URL#sha256=<lowercase hex>
    assert branch.index("throw") < branch.index("Kind = 'artifact'")
    assert 'Spec = "$url#sha256=$hash"; Url = $url; Sha256 = $hash' in branch
    assert resolve.index("$hash = $hash.ToLowerInvariant()") < resolve.index("Kind = 'artifact'")
    assert 'INSTALL_SPEC="$url#sha256=$ARTIFACT_SHA256"' in INSTALLER.read_text(encoding="utf-8")


def test_windows_installer_checks_the_artifact_sha256_before_running_it() -> None:
    functions, flow = windows_install_flow()
    # the download is compared with the expected hash, and refused, before the path is returned
    fetch = functions["Get-AgentArtifact"]
    assert fetch.index("Get-FileHash -LiteralPath $target -Algorithm SHA256") < fetch.index(
        "if ($actual -ne $Artifact.Sha256) {\n        throw"
    )
    assert fetch.rstrip().endswith("return $target")
    assert "& $" not in fetch, "nothing may run while the artifact is fetched"
    # the install flow runs only the checked file, and fetches it before the running service is removed
    fetched = re.search(r"\$(\w+) = Get-AgentArtifact \$agentPackage", flow)
    assert fetched
    run = re.search(rf"Install-AgentArtifact \$pythonExe \${fetched.group(1)} ", flow)
    assert run
    assert fetched.start() < flow.index("Remove-AgentService") < run.start()
    # and Install-AgentArtifact is the only place that runs a PEX
    runs = [name for name, body in functions.items() if re.search(r"& \$PythonExe \$\w+ venv", body)]
    assert runs == ["Install-AgentArtifact"]


def test_windows_installer_retries_the_download_as_often_as_the_linux_one() -> None:
    functions, _ = windows_install_flow()
    fetch = functions["Get-AgentArtifact"]
    linux = re.search(r"curl [^\n]*--retry (\d+)", INSTALLER.read_text(encoding="utf-8"))
    assert linux
    # the download is inside a loop that gives up after as many attempts as curl makes
    loop = re.search(r"for \(\$attempt = 1; ; \$attempt\+\+\) \{(.*?)\n        \}", fetch, flags=re.DOTALL)
    assert loop, "the download is not retried"
    assert "Invoke-WebRequest -Uri $Artifact.Url" in loop.group(1)
    assert f"if ($attempt -ge {linux.group(1)})" in loop.group(1)


def test_windows_installer_makes_the_venv_with_pex_tools_as_the_linux_one_and_no_pip() -> None:
    functions, flow = windows_install_flow()
    linux = re.sub(r"\\\n\s*", " ", INSTALLER.read_text(encoding="utf-8"))  # continued lines joined
    linux_run = re.search(r'env (.*?) PEX_TOOLS=1 "\$PYTHON" "\$work/agent.pex" venv (.*?) "\$venv"', linux)
    assert linux_run
    install = functions["Install-AgentArtifact"]
    # GIVEN the PEX's own tool, with the same flags as on Linux
    windows_run = re.search(r"& \$PythonExe \$PexFile venv (.*?) \$Venv", install)
    assert windows_run
    assert windows_run.group(1).split() == linux_run.group(2).split() == ["--compile"]
    # WITH PEX_TOOLS=1, a scratch PEX_ROOT and the same PEX_* variables removed
    assert "PEX_TOOLS = '1'" in install
    assert "PEX_ROOT = $PexRoot" in install
    assert set(re.findall(r"(PEX_\w+) = \$null", install)) == set(re.findall(r"-u (PEX_\w+)", linux_run.group(1)))
    assert re.search(r"Invoke-WithEnvironment \$pexEnvironment \{\s*Invoke-Native 'pex venv' \{ & \$PythonExe", install)
    # THEN no pip: pip runs in Install-PipPackage alone, which the flow calls only without an artifact
    assert "pip" not in install
    assert [name for name, body in functions.items() if "-m pip" in body] == ["Install-PipPackage"]
    assert re.search(
        r"\} elseif \(\$pexFile\) \{\s*Install-AgentArtifact [^\n]*\s*\} else \{\s*Install-PipPackage ", flow
    ), "pip must be the alternative to the artifact, not a step after it"
    assert re.search(r"if \(\$rebuild -and \$agentPackage\.Kind -eq 'artifact'\) \{", flow)


def test_windows_installer_rebuilds_only_a_changed_spec_and_records_it_once_it_works() -> None:
    functions, flow = windows_install_flow()
    # an unchanged spec whose mbridge runs is kept, unless -Force
    assert "$rebuild = $Force -or -not (Test-AgentInstalled $agentPackage.Spec)" in flow
    assert "$installed -eq $Spec -and (Test-Venv)" in functions["Test-AgentInstalled"]
    assert re.search(r"if \(-not \$rebuild\) \{\s*Write-Step", flow)
    # both ways record their spec last, once the new virtualenv's mbridge runs
    assert functions["Install-AgentArtifact"].rstrip().endswith("Save-InstalledSpec $Spec")
    assert functions["Install-PipPackage"].rstrip().endswith("Save-InstalledSpec $Requirement")
    save = functions["Save-InstalledSpec"]
    assert save.index("if (-not (Test-Venv)) { throw") < save.index("Set-Content -LiteralPath $SpecStamp")


def test_windows_installer_asks_for_long_paths_before_it_changes_anything() -> None:
    # pex unpacks the artifact into paths longer than Windows' 260 characters
    functions, flow = windows_install_flow()
    check = functions["Assert-LongPaths"]
    assert "'LongPathsEnabled'" in check
    assert re.search(r"if \(\$enabled -ne 1\) \{\s*throw '[^']*long paths", check)
    assert (
        "Set-ItemProperty HKLM:\\SYSTEM\\CurrentControlSet\\Control\\FileSystem -Name LongPathsEnabled -Value 1"
        in check
    )
    assert flow.index("Assert-LongPaths") < flow.index("Get-AgentArtifact") < flow.index("Remove-AgentService")


def test_windows_installer_wraps_the_console_agent_instead_of_registering_it() -> None:
    code = powershell_code(WINDOWS.read_text(encoding="utf-8"))
    # the SCM kills a console program registered directly after 30 s (error 1053)
    assert "New-Service" not in code
    assert "& $Wrapper install" in code
    assert "#Requires -RunAsAdministrator" in WINDOWS.read_text(encoding="utf-8")
    assert re.search(r"\[switch\] \$Uninstall", code)
    # least privilege by default: the virtual service account
    assert "[string] $ServiceAccount = 'Virtual'" in code
    assert '$VirtualAccount = "NT SERVICE\\$ServiceId"' in code


def test_windows_installer_writes_a_wellformed_winsw_configuration() -> None:
    # GIVEN the WinSW XML template, with the script's expressions filled in
    text = WINDOWS.read_text(encoding="utf-8")
    template = re.search(r'\$xml = @"\n(.*?)\n"@', text, flags=re.DOTALL)
    assert template, "the WinSW XML here-string was not found"
    filled = (
        template.group(1)
        .replace("$ServiceId", "mbridge-agent")
        .replace("$envBlock", '  <env name="MBRIDGE_CLOUD" value="azure" />')
    )
    filled = re.sub(r"\$\(& \$esc \$\w+\)", r"C:\\path", filled)
    assert "$" not in filled, "an expression of the template was not filled in"
    # WHEN it is parsed as XML
    service = ET.fromstring(filled)  # noqa: S314 - the template is this repository's own file
    # THEN it is WinSW's <service> running `mbridge.exe agent`, restarting on failure, rotating logs
    assert service.tag == "service"
    assert service.findtext("id") == "mbridge-agent"
    assert service.findtext("arguments") == "agent"
    assert service.findtext("startmode") == "Automatic"
    failures = service.findall("onfailure")
    assert failures
    assert {f.get("action") for f in failures} == {"restart"}
    log = service.find("log")
    assert log is not None
    assert log.get("mode") == "roll-by-size"
    stop = service.findtext("stoptimeout") or ""
    assert int(stop.split()[0]) > 10  # the agent flushes its outbox for up to 10 s


def test_windows_installer_sets_only_variables_the_agent_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    code = powershell_code(WINDOWS.read_text(encoding="utf-8"))
    variables = set(re.findall(r"\b(MBRIDGE_[A-Z_]+|AZURE_CLIENT_ID)\b", code))
    assert {"MBRIDGE_CLOUD", "MBRIDGE_TRANSPORT", "MBRIDGE_STATE_DIR", "AZURE_CLIENT_ID"} <= variables
    assert_agent_reads(variables, monkeypatch, WINDOWS.name)
