"""Small agreements between the Bicep and the Azure Terraform that neither's own tests pinned.

GIVEN the Bicep (pycep) and the Azure Terraform (python-hcl2)
WHEN  their bounds, names, settings and checkov skip reasons are read
THEN  the Flex Consumption instance bounds agree, every Key Vault name starts with a letter,
      MBRIDGE_READINESS_DRAIN is a parameter in both, both function apps refuse inbound HTTP, and
      the vault's purge-protection skip says what purge protection does.
"""

from __future__ import annotations

import re

from tests.infra.bicep_facts import Deployment, render
from tests.infra.sources import BICEP_DIR, TERRAFORM_AZURE, load_terraform, terraform_resources, terraform_variables


def _terraform() -> dict[str, list[object]]:
    return load_terraform(TERRAFORM_AZURE)


def test_flex_maximum_instance_count_starts_at_40_in_both() -> None:
    # GIVEN the Bicep's bounds (Flex Consumption's lowest maximum is 40)
    main = Deployment().main
    decorators = {
        d["type"]: d["argument"]
        for d in main.section("parameters")["functionMaximumInstanceCount"]["decorators"]
        if "argument" in d
    }
    assert (decorators.get("min_value"), decorators.get("max_value")) == (40, 1000)
    # THEN the Terraform's validation refuses 39 and takes 40
    condition = terraform_variables(_terraform())["function_maximum_instance_count"]["validation"][0]["condition"]
    assert "var.function_maximum_instance_count >= 40" in condition, condition


def test_the_signing_vault_name_starts_with_a_letter_whatever_the_prefix() -> None:
    # GIVEN namePrefix, which may start with a digit (the storage account takes it)
    main = Deployment().main
    name = main.section("modules")["signingVault"]["config"]["config"]["params"]["vaultName"]
    # THEN the vault name begins with literal letters, never with the prefix (Key Vault names
    # start with a letter), and fits 24 characters: 3 + 7 + 1 + 13
    assert re.match(r"^[a-z]+-\$\{take\(namePrefix, 7\)\}-\$\{suffix\}$", name), name
    # AND the Terraform's prefix is validated to start with a letter
    prefix = terraform_variables(_terraform())["name_prefix"]["validation"][0]["condition"]
    assert "^[a-z]" in prefix, prefix


def test_readiness_drain_is_a_parameter_in_both() -> None:
    # GIVEN the Bicep with readinessDrain false, then with its default THEN the setting follows it
    assert render(Deployment(parameters={"readinessDrain": False}).settings["MBRIDGE_READINESS_DRAIN"]) == "false"
    deployment = Deployment()
    assert deployment.main.section("parameters")["readinessDrain"]["default"] is True
    assert render(deployment.settings["MBRIDGE_READINESS_DRAIN"]) == "readinessDrain ? 'true' : 'false'"
    # AND the Terraform's follows its variable
    tf_setting = next(
        body["MBRIDGE_READINESS_DRAIN"]
        for block in _terraform()["locals"]
        for name, body in block.items()  # type: ignore[attr-defined]
        if name == "function_app_settings"
    )
    assert "var.readiness_drain" in tf_setting


def test_both_function_apps_refuse_inbound_http() -> None:
    site = Deployment().site
    assert site.get("properties", "siteConfig", "ipSecurityRestrictionsDefaultAction") == "Deny"
    app = terraform_resources(_terraform())["azurerm_function_app_flex_consumption.this"]
    assert app["site_config"][0]["ip_restriction_default_action"] == "Deny"


def test_the_purge_protection_skip_says_what_purge_protection_does() -> None:
    # Purge protection keeps a deleted vault from being purged (its name stays taken for the
    # retention period); it makes nothing unremovable.
    for path in (TERRAFORM_AZURE / "signing.tf", BICEP_DIR / "modules" / "signing-vault.bicep"):
        reason = next(line for line in path.read_text().splitlines() if "checkov:skip=CKV_AZURE_110" in line)
        assert "purg" in reason, reason
        assert "unremovable" not in reason, f"{path.name}: {reason}"
