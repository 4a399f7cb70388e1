"""The post-deploy check of the function app's Key Vault references (scripts/check_keyvault_references.py).

GIVEN a recorded-shape answer of `GET <site>/config/configreferences/appsettings` (one reference
      denied, one resolved) and a fake Azure CLI
WHEN  the script reads it, with and without --restart
THEN  it names each setting and status, fails while one is unresolved, restarts the app and reads
      again until all resolve, and both deployments print the command.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from scripts import check_keyvault_references as check
from tests.infra.bicep_facts import Deployment, render_node
from tests.infra.sources import TERRAFORM_AZURE, load_terraform, terraform_outputs

ANSWER = Path(__file__).parent / "fixtures" / "configreferences-appsettings.json"
RESOLVED: dict[str, object] = {"value": [{"name": "MBRIDGE_SIGNING_KEY", "properties": {"status": "Resolved"}}]}


def test_the_answer_is_read_setting_by_setting() -> None:
    references = check.references_of(json.loads(ANSWER.read_text()))
    assert [(r.setting, r.status) for r in references] == [
        ("MBRIDGE_SIGNING_KEY", "AccessToKeyVaultDenied"),
        ("MBRIDGE_WEBHOOK_URL", "Resolved"),
    ]
    assert [r.setting for r in check.unresolved(references)] == ["MBRIDGE_SIGNING_KEY"]
    assert "denied access" in references[0].details


def test_a_recorded_answer_with_an_unresolved_reference_fails(capsys) -> None:  # type: ignore[no-untyped-def]
    assert check.main(["--resource-group", "rg", "--name", "app", "--from-file", str(ANSWER)]) == 1
    assert "MBRIDGE_SIGNING_KEY: AccessToKeyVaultDenied" in capsys.readouterr().out


class FakeAz:
    def __init__(self, answers: list[dict[str, object]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, arguments: Sequence[str]) -> str:
        self.calls.append(list(arguments))
        if arguments[:2] == ["account", "show"]:
            return "sub-1\n"
        if arguments[0] == "rest":
            return json.dumps(self.answers.pop(0))
        return ""


def test_without_restart_it_reports_and_fails_without_touching_the_app() -> None:
    az = FakeAz([json.loads(ANSWER.read_text())])
    assert check.main(["--resource-group", "rg", "--name", "app"], run=az) == 1
    assert az.calls[1][:4] == ["rest", "--method", "get", "--url"]
    assert az.calls[1][4] == (
        "https://management.azure.com/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Web/sites/app"
        "/config/configreferences/appsettings?api-version=2022-03-01"
    )
    assert not [call for call in az.calls if call[0] == "functionapp"]


def test_with_restart_it_restarts_until_every_reference_resolves() -> None:
    az = FakeAz([json.loads(ANSWER.read_text()), RESOLVED])
    url = check.site_url("sub-1", "rg", "app")
    restart = ["functionapp", "restart", "--resource-group", "rg", "--name", "app"]
    assert check.check(az, url, restart, attempts=3, wait=0, sleep=lambda _: None) == 0
    assert [call[0] for call in az.calls] == ["rest", "functionapp", "rest"]
    # AND gives up after its attempts
    az = FakeAz([json.loads(ANSWER.read_text())] * 3)
    assert check.check(az, url, restart, attempts=2, wait=0, sleep=lambda _: None) == 1


def test_an_answer_of_another_shape_is_an_error() -> None:
    assert check.main(["--resource-group", "rg", "--name", "app"], run=lambda _: '{"error": {}}') == 2


def test_both_deployments_print_the_command() -> None:
    outputs = terraform_outputs(load_terraform(TERRAFORM_AZURE))
    command = str(outputs["key_vault_references_check_command"]["value"])
    assert "scripts/check_keyvault_references.py" in command
    assert "--restart" in command
    main = Deployment().main
    bicep = render_node(main, main.section("outputs")["keyVaultReferencesCheckCommand"]["value"])
    assert "scripts/check_keyvault_references.py" in bicep
    assert "--restart" in bicep
