"""The Google Cloud deployment (infra/terraform/gcp/), read as data with python-hcl2.

GIVEN the parsed Terraform of the root module and of modules/vm_commands_subscription
WHEN  it is compared with docs/architecture.md, docs/contracts.md, docs/gcp.md, docs/transports.md
      and the code it deploys
THEN  it wires the topics, the push delivery with dead-lettering, the function, Firestore and the
      per-VM command subscriptions as the code expects, with least-privilege IAM only.

Where the code defines a fact (setting names, permissions, attribute names, collection fields),
the test reads it from the code, so that the infrastructure cannot drift from it unnoticed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agent.messages import result_message
from functions.core import audit_codec
from functions.gcp_app import autohealer, compute, instance_directory, probe_times, settings
from functions.gcp_app.commands import command_message
from scripts.build_function_package import CLOUDS, build, package_files
from tests.infra import console
from tests.infra.sources import (
    AGENT_INSTALL,
    REPO_ROOT,
    TERRAFORM_GCP,
    assert_agent_package_is_pinned,
    load_terraform,
    terraform_outputs,
    terraform_resources,
    terraform_variables,
)
from wire.commands import DEFAULT_TTL, CommandType, new_command
from wire.identity import DEFAULT_AUDIENCE
from wire.model import Cloud, CommandResult
from wire.transports.pubsub import EVENTS_ORDERING_KEY, EVENTS_SUBSCRIPTION_ORDERED

MODULE_DIR = TERRAFORM_GCP / "modules" / "vm_commands_subscription"
FUNCTION = "google_cloudfunctions2_function.events"
PUSH = "google_pubsub_subscription.functions"
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)

Body = dict[str, Any]


# ---------------------------------------------------------------- reading the sources


@cache
def root() -> dict[str, list[Any]]:
    return load_terraform(TERRAFORM_GCP)


@cache
def module() -> dict[str, list[Any]]:
    return load_terraform(MODULE_DIR)


def resources(parsed: dict[str, list[Any]] | None = None) -> dict[str, Body]:
    return terraform_resources(root() if parsed is None else parsed)


def resource(key: str, parsed: dict[str, list[Any]] | None = None) -> Body:
    found = resources(parsed)
    assert key in found, f"{key} is not declared"
    return found[key]


def of_type(resource_type: str, parsed: dict[str, list[Any]] | None = None) -> dict[str, Body]:
    return {key: body for key, body in resources(parsed).items() if key.split(".")[0] == resource_type}


def block(body: Body, name: str) -> Body:
    """The one nested block `name` of a resource body (python-hcl2 gives blocks as lists)."""
    blocks = body.get(name)
    assert isinstance(blocks, list), f"{name} is not a block: {blocks!r}"
    assert len(blocks) == 1, f"expected exactly one {name} block, got {blocks!r}"
    found: Body = blocks[0]
    return found


def local(name: str) -> Any:
    values = {key: value for entry in root().get("locals", []) for key, value in entry.items()}
    assert name in values, f"local.{name} is not declared"
    return values[name]


def default(name: str, parsed: dict[str, list[Any]] | None = None) -> Any:
    variables = terraform_variables(root() if parsed is None else parsed)
    assert "default" in variables[name], f"var.{name} has no default"
    return variables[name]["default"]


def ref(address: str) -> str:
    """How python-hcl2 renders a bare reference: `${google_pubsub_topic.events.id}`."""
    return "${" + address + "}"


def resolved(text: str, parsed: dict[str, list[Any]] | None = None) -> str:
    """`text` with every `${var.x}` replaced by the variable's default."""
    return re.sub(r"\$\{var\.(\w+)\}", lambda match: str(default(match.group(1), parsed)), text)


def strings(value: Any) -> Iterator[str]:
    """Every string anywhere in a parsed value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def iam_grants() -> dict[str, Body]:
    """Every IAM grant of the root module and of the command-subscription module."""
    found = {key: body for key, body in resources().items() if re.search(r"_iam_(member|binding|policy)\.", key)}
    found.update(
        {
            f"module.{key}": body
            for key, body in resources(module()).items()
            if re.search(r"_iam_(member|binding)\.", key)
        }
    )
    return found


# ---------------------------------------------------------------- providers


def test_versions_pin_terraform_and_the_providers() -> None:
    terraform = root()["terraform"][0]
    assert terraform["required_version"] == ">= 1.6"
    providers = terraform["required_providers"][0]
    assert re.fullmatch(r"~> 6\.\d+", providers["google"]["version"])
    assert providers["google"]["source"] == "hashicorp/google"
    # archive_file builds the function's zip from source blocks, within 2.x
    archive = re.fullmatch(r"~> (\d+)\.(\d+)", providers["archive"]["version"])
    assert archive, providers["archive"]["version"]
    major, minor = int(archive.group(1)), int(archive.group(2))
    assert (major, minor) >= (2, 5)
    # tls makes the command signing key: Ed25519 and PKCS#8 PEM are in 4.0
    assert providers["tls"]["source"] == "hashicorp/tls"
    assert re.fullmatch(r"~> 4\.\d+", providers["tls"]["version"])
    module_google = module()["terraform"][0]["required_providers"][0]["google"]
    assert module_google["version"] == providers["google"]["version"]


# ---------------------------------------------------------------- topics and subscriptions


def test_the_topics_exist_with_optional_cmek() -> None:
    topics = of_type("google_pubsub_topic")
    assert {body["name"] for body in topics.values()} == {
        "maintenance-events",
        "${local.commands_topic_names[count.index]}",
        "maintenance-events-dead",
        # the control plane's path (central.tf)
        "maintenance-central",
        "maintenance-central-tick",
        "maintenance-central-dead",
    }
    # one commands topic per shard, maintenance-commands first (commands_shards.tf)
    assert resource("google_pubsub_topic.commands")["count"] == ref("var.commands_shards")
    assert local("commands_topic_names").startswith(
        "${[for shard in range(var.commands_shards) : "
        'shard == 0 ? "maintenance-commands" : "maintenance-commands-${shard}"'
    )
    assert all(body["kms_key_name"] == ref("var.kms_key_name") for body in topics.values())
    assert default("kms_key_name") is None


def test_push_subscription_delivers_events_to_the_function_as_the_push_invoker() -> None:
    push = resource(PUSH)
    assert push["name"] == "maintenance-events-functions"
    assert push["topic"] == ref("google_pubsub_topic.events.id")
    config = block(push, "push_config")
    function_uri = ref(f"{FUNCTION}.service_config[0].uri")
    assert config["push_endpoint"].startswith(function_uri)
    token = block(config, "oidc_token")
    assert token["service_account_email"] == ref("google_service_account.push_invoker.email")
    assert token["audience"] == function_uri


def test_push_subscription_retries_then_dead_letters() -> None:
    push = resource(PUSH)
    dead_letter = block(push, "dead_letter_policy")
    assert dead_letter["dead_letter_topic"] == ref("google_pubsub_topic.dead_letters.id")
    assert resource("google_pubsub_topic.dead_letters")["name"] == "maintenance-events-dead"
    attempts = dead_letter["max_delivery_attempts"]
    if attempts == ref("var.max_delivery_attempts"):
        attempts = default("max_delivery_attempts")
    assert 5 <= attempts <= 20
    retry = block(push, "retry_policy")
    assert (retry["minimum_backoff"], retry["maximum_backoff"]) == ("10s", "600s")
    assert block(push, "expiration_policy")["ttl"] == ""


def test_push_ack_deadline_outlasts_the_function() -> None:
    # For push, the ack deadline is how long Pub/Sub waits for the answer: a shorter one would
    # redeliver events the function is still working on.
    timeout = block(resource(FUNCTION), "service_config")["timeout_seconds"]
    assert resource(PUSH)["ack_deadline_seconds"] >= timeout


def test_push_subscription_gives_no_agent_an_ordering_lane_to_flood() -> None:
    # The functions' subscription has message ordering off, as the code expects: the agents publish
    # events without an ordering key (any agent could write another VM's name as one and hold up
    # its events behind junk: tests/drills/test_ordering_flood.py), and the functions rely on no
    # order (docs/transports.md#why-events-carry-no-ordering-key).
    assert EVENTS_SUBSCRIPTION_ORDERED is False
    assert EVENTS_ORDERING_KEY == ""
    assert resource(PUSH)["enable_message_ordering"] is EVENTS_SUBSCRIPTION_ORDERED


def test_dead_letters_are_kept_on_a_pull_subscription() -> None:
    inspect = resource("google_pubsub_subscription.dead_letters_inspect")
    assert inspect["name"] == "maintenance-events-dead-inspect"
    assert inspect["topic"] == ref("google_pubsub_topic.dead_letters.id")
    assert "push_config" not in inspect
    assert block(inspect, "expiration_policy")["ttl"] == ""


def test_operator_results_sees_exactly_the_command_results_the_agent_publishes() -> None:
    results = resource("google_pubsub_subscription.operator_results")
    assert results["topic"] == ref("google_pubsub_topic.events.id")
    match = re.fullmatch(r'hasPrefix\(attributes\.(\w+), "([^"]+)"\)', results["filter"])
    assert match, results["filter"]
    attribute, prefix = match.groups()
    for accepted in (True, False):
        message = result_message(CommandResult("c-1", accepted, "E-1", "web-0"), Cloud.GCE, "web-0", NOW)
        assert message.attributes[attribute].startswith(prefix)


def test_every_vm_gets_its_own_command_subscription_and_identity() -> None:
    # GIVEN the VMs given a commands subscription: the example VMs and the example group's members
    calls = root()["module"][0]
    assert set(calls) == {"vm_commands"}
    call = calls["vm_commands"]
    assert call["source"] == "./modules/vm_commands_subscription"
    assert local("commands_vm_names") == "${distinct(concat(var.vm_names, var.mig_vm_names))}"
    # THEN each has its subscription on its shard's topic
    assert call["for_each"] == "${toset(local.commands_vm_names)}"
    assert call["vm_name"] == ref("each.value")
    assert call["commands_topic_id"] == ref("google_pubsub_topic.commands[local.vm_commands_shards[each.value]].id")
    assert local("vm_commands_shards") == (
        "${{for name in local.commands_vm_names : "
        "name => parseint(substr(sha256(lower(name)), 0, 8), 16) % var.commands_shards}}"
    )
    # AND an example VM's is readable by its own account alone, which no other VM holds; the
    # group's members share their template's (mig_example.tf), and an example VM's name wins
    assert call["agent_service_account_email"] == ref("local.commands_subscribers[each.value]")
    assert local("commands_subscribers") == (
        "${merge({for name in var.mig_vm_names : name => google_service_account.mig_agent[0].email}, "
        "{for name in var.vm_names : name => google_service_account.agent[name].email})}"
    )
    assert resource("google_service_account.agent")["for_each"] == "${toset(var.vm_names)}"


# ---------------------------------------------------------------- the command-subscription module


def test_module_subscription_filters_on_the_commands_target_attribute() -> None:
    subscription = resource("google_pubsub_subscription.commands", module())
    assert subscription["name"] == "maintenance-commands-${var.vm_name}"
    assert subscription["topic"] == ref("var.commands_topic_id")
    assert subscription["filter"] == 'attributes.target = "${var.vm_name}"'
    # The functions address commands with exactly that attribute.
    command = new_command(CommandType.DRAIN, target="web-0", event_id="E-1", issued_at=NOW)
    assert command_message(command).attributes["target"] == "web-0"


def test_module_subscription_is_ordered_short_lived_and_never_expires() -> None:
    subscription = resource("google_pubsub_subscription.commands", module())
    assert subscription["enable_message_ordering"] is True
    assert block(subscription, "expiration_policy")["ttl"] == ""
    assert resolved(subscription["ack_deadline_seconds"], module()) == "60"
    retention = int(resolved(subscription["message_retention_duration"], module()).removesuffix("s"))
    # Kept about as long as a command lives (DEFAULT_TTL); 600 s is Pub/Sub's minimum.
    assert 600 <= retention <= 2 * DEFAULT_TTL.total_seconds()
    assert "dead_letter_policy" in {key for entry in subscription.get("dynamic", []) for key in entry}


def test_module_grants_the_subscriber_role_on_the_subscription_only() -> None:
    grants = {key: body for key, body in resources(module()).items() if "_iam_" in key}
    assert grants, "the module grants nothing"
    assert all(key.startswith("google_pubsub_subscription_iam_member.") for key in grants)
    agent = grants["google_pubsub_subscription_iam_member.agent"]
    assert agent["subscription"] == ref("google_pubsub_subscription.commands.name")
    assert agent["role"] == "roles/pubsub.subscriber"
    assert agent["member"] == "serviceAccount:${var.agent_service_account_email}"


# ---------------------------------------------------------------- the function


def test_function_is_called_by_the_push_subscription_not_by_eventarc() -> None:
    function = resource(FUNCTION)
    assert "event_trigger" not in function
    assert not of_type("google_eventarc_trigger")


def test_function_builds_the_entry_point_of_main_py() -> None:
    build = block(resource(FUNCTION), "build_config")
    assert build["runtime"] == "python311"
    assert build["entry_point"] == "on_maintenance_event"
    main_py = (REPO_ROOT / "main.py").read_text(encoding="utf-8")
    assert re.search(rf"^from \S+ import {build['entry_point']}$", main_py, re.MULTILINE)


def test_function_service_settings() -> None:
    service = block(resource(FUNCTION), "service_config")
    assert service["timeout_seconds"] == 540
    assert service["available_memory"] == "512M"
    # several events per instance, each on a thread of functions-framework's gunicorn
    assert service["available_cpu"] == "1"
    assert service["max_instance_request_concurrency"] == "${var.function_concurrency}"
    assert service["ingress_settings"] == "ALLOW_INTERNAL_ONLY"
    assert service["all_traffic_on_latest_revision"] is True
    assert service["service_account_email"] == ref("google_service_account.function.email")
    assert service["environment_variables"] == (
        "${merge(local.function_environment, local.function_policy_environment, "
        "{THREADS = tostring(var.function_concurrency)})}"
    )


def test_function_environment_names_are_the_settings_the_code_reads() -> None:
    environment = local("function_environment")
    known = {value for name, value in vars(settings).items() if name.startswith("ENV_")}
    assert set(environment) <= known
    assert {
        settings.ENV_PROJECT,
        settings.ENV_FIRESTORE_DATABASE,
        settings.ENV_FIRESTORE_PREFIX,
        settings.ENV_COMMANDS_TOPIC,
        settings.ENV_INSTANCE_GROUPS,
        settings.ENV_MAINTENANCE_ZONES,
        settings.ENV_READINESS_DRAIN,
        settings.ENV_LOG_LEVEL,
    } <= set(environment)
    assert environment[settings.ENV_FIRESTORE_DATABASE] == ref("google_firestore_database.main.name")
    assert environment[settings.ENV_COMMANDS_TOPIC] == ref("google_pubsub_topic.commands[0].name")
    assert environment[settings.ENV_COMMANDS_SHARDS] == ref("tostring(var.commands_shards)")
    assert settings.ENV_POLICY in local("function_policy_environment")
    # The example's group is always drained.
    assert '"${var.zone}/${var.instance_group_name}"' in local("instance_groups")


# Variables settings.py reads that are not deployed: the runtime's own project variable, and
# defaults that fit (the Compute timeout, the URL of Google's certificates, the 60 s between two
# summaries of refused reports, which is refused without a webhook URL and so is set by hand).
NOT_DEPLOYED = {
    settings.ENV_PROJECT_FALLBACK,
    settings.ENV_COMPUTE_TIMEOUT,
    settings.ENV_TRUST_CERTS_URL,
    settings.ENV_WEBHOOK_SUMMARY_SECONDS,
    # the tick reads upcomingMaintenance unless set false: its default is what a deployment wants
    settings.ENV_CENTRAL_UPCOMING,
    # the autohealer check is on unless set false, for agents on the default health port
    settings.ENV_AUTOHEALER_CHECK,
    settings.ENV_AGENT_HEALTH_PORT,
    # the probes' times are read unless set false (docs/policy.md#probe-aware-drains)
    settings.ENV_READ_PROBES,
}
# A trust file makes the function trust the keys written in it instead of Google's: local runs only.
NEVER_DEPLOYED = {settings.ENV_TRUST_FILE}


def deployed_environment() -> set[str]:
    """Every variable the function is deployed with: plain, conditional (the policy) and secret."""
    service = block(resource(FUNCTION), "service_config")
    names = set(local("function_environment"))
    names |= set(re.findall(r"\b(MBRIDGE_[A-Z_]+)\s*=", local("function_policy_environment")))
    names.add(block(service, "secret_environment_variables")["key"])
    # and the secret mounted only when given (the webhook URL), a dynamic block
    for dynamic in service.get("dynamic", []):
        for content in unquoted_keys(dynamic).get("secret_environment_variables", {}).get("content", []):
            names.add(content["key"])
    return names


def unquoted_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    """A block's keys as written, without the quotes python-hcl2 keeps on some of them."""
    return {key.strip('"'): value for key, value in mapping.items()}


def test_deployed_settings_are_the_ones_the_function_reads() -> None:
    # GIVEN the variables settings.py reads, and the ones the function is deployed with
    defined = {value for name, value in vars(settings).items() if name.startswith("ENV_")}
    deployed = deployed_environment()
    assert defined >= NOT_DEPLOYED | NEVER_DEPLOYED
    # THEN each is deployed but the defaults kept, and nothing else is
    assert deployed == defined - NOT_DEPLOYED - NEVER_DEPLOYED


def test_reports_are_trusted_from_the_project_with_the_agents_audience() -> None:
    # GIVEN policy trust attested (the default): identity tokens of VMs of the trusted projects,
    # asked for the trusted audience
    environment = local("function_environment")
    # THEN the projects are the deployment's own unless others are given
    assert environment[settings.ENV_TRUST_PROJECTS] == '${join(",", local.trust_projects)}'
    assert local("trust_projects") == "${length(var.trust_projects) > 0 ? var.trust_projects : [var.project_id]}"
    assert default("trust_projects") == []
    # AND the zones every zone of them unless given
    assert environment[settings.ENV_TRUST_ZONES] == '${join(",", var.trust_zones)}'
    assert default("trust_zones") == []
    # AND the function accepts the audience the example VMs' agents ask for
    assert environment[settings.ENV_TRUST_AUDIENCE] == ref("local.identity_audience")
    agent = dict(re.findall(r'"(MBRIDGE_[A-Z_]+)=([^"]*)\\n"', local("agent_environment")))
    assert agent["MBRIDGE_IDENTITY_AUDIENCE"] == ref("local.identity_audience")


def test_the_audience_is_the_deployments_own_unless_one_is_given() -> None:
    # GIVEN no audience set THEN it names the project and the function, not the shared default
    assert default("identity_audience") is None
    assert local("identity_audience") == (
        '${coalesce(var.identity_audience, "maintenance-bridge/${var.project_id}/${var.function_name}")}'
    )
    assert DEFAULT_AUDIENCE not in {default("identity_audience"), local("identity_audience")}
    # AND agents outside the example can be given it
    assert terraform_outputs(root())["identity_audience"]["value"] == ref("local.identity_audience")


def test_the_function_may_list_instances_of_each_trusted_project_and_nothing_more() -> None:
    # Which instance a VM name stands for: instances.aggregatedList by name in each trusted project.
    role = resource("google_project_iam_custom_role.instance_reader")
    assert role["for_each"] == "${toset(local.trust_projects)}"
    assert role["project"] == ref("each.value")
    # ... and the reads of what autohealing an instance, and of its load balancers' health checks,
    # before a drain through /readyz, nothing else
    assert role["permissions"] == [
        "compute.instances.list",
        *autohealer.READ_PERMISSIONS,
        *probe_times.READ_PERMISSIONS,
    ]
    grant = resource("google_project_iam_member.function_instance_reader")
    assert grant["for_each"] == "${toset(local.trust_projects)}"
    assert grant["project"] == ref("each.value")
    assert grant["role"] == ref("google_project_iam_custom_role.instance_reader[each.value].name")
    assert grant["member"] == "serviceAccount:${google_service_account.function.email}"
    # AND it is the permission the code's errors name
    assert instance_directory.LIST_PERMISSION == "compute.instances.list"
    assert role["role_id"] == instance_directory.ROLE


def test_signing_key_is_always_mounted_from_secret_manager() -> None:
    # GIVEN the function's secret environment variable
    service = block(resource(FUNCTION), "service_config")
    # not conditional: every command is signed (the one dynamic secret is the optional webhook URL)
    for dynamic in service.get("dynamic", []):
        for content in unquoted_keys(dynamic).get("secret_environment_variables", {}).get("content", []):
            assert content["key"] != settings.ENV_SIGNING_KEY
    secret = block(service, "secret_environment_variables")
    assert secret["key"] == settings.ENV_SIGNING_KEY
    assert (secret["secret"], secret["version"]) == (
        ref("local.signing_key_secret_id"),
        ref("local.signing_key_secret_version"),
    )
    assert settings.ENV_SIGNING_KEY not in local("function_environment")  # never as plain text
    # AND the runtime account alone may read that secret
    accessor = resource("google_secret_manager_secret_iam_member.signing_key")
    assert "count" not in accessor
    assert accessor["role"] == "roles/secretmanager.secretAccessor"
    assert accessor["secret_id"] == ref("local.signing_key_secret_id")
    assert accessor["member"] == "serviceAccount:${google_service_account.function.email}"


def test_signing_key_is_generated_into_a_secret_unless_one_is_given() -> None:
    # GIVEN no secret of one's own (the default)
    assert default("signing_key_secret_id") is None
    assert local("generate_signing_key") == "${var.signing_key_secret_id == null}"
    # THEN an Ed25519 pair is made, its PKCS#8 PEM stored in a secret of the deployment ...
    key = resource("tls_private_key.commands")
    assert key["algorithm"] == "ED25519"
    version = resource("google_secret_manager_secret_version.signing_key")
    assert version["secret_data"] == ref("tls_private_key.commands[0].private_key_pem_pkcs8")
    assert version["secret"] == ref("google_secret_manager_secret.signing_key[0].id")
    for address in (
        "tls_private_key.commands",
        "google_secret_manager_secret.signing_key",
        "google_secret_manager_secret_version.signing_key",
    ):
        assert resource(address)["count"] == "${local.generate_signing_key ? 1 : 0}", address
    # ... whose pinned version the function mounts, and whose public key the agents get
    assert local("signing_key_secret_id").startswith(
        "${local.generate_signing_key ? google_secret_manager_secret.signing_key[0].secret_id :"
    )
    assert local("signing_key_secret_version").startswith(
        "${local.generate_signing_key ? google_secret_manager_secret_version.signing_key[0].version :"
    )
    assert "tls_private_key.commands[0].public_key_pem" in local("verify_key")
    assert local("verify_key").endswith(": var.verify_key}")
    assert terraform_outputs(root())["agent_verify_key"]["value"] == ref("local.verify_key")
    # AND a secret of one's own needs its public key, and a generated one takes none
    preconditions = [
        condition["condition"]
        for lifecycle in resource(FUNCTION).get("lifecycle", [])
        for condition in lifecycle.get("precondition", [])
    ]
    assert '${(var.signing_key_secret_id == null) == (var.verify_key == "")}' in preconditions


# ---------------------------------------------------------------- the function's source zip


def skip_pattern() -> re.Pattern[str]:
    """local.function_source_skipped: RE2, which Python reads alike for this pattern."""
    return re.compile(local("function_source_skipped"))


def function_source_files() -> set[str]:
    """local.function_source_files as Terraform computes it: every file fileset() lists under the packages,
    but those of the left-out prefixes and those the skip pattern matches."""
    expression = local("function_source_files")
    # the expression filters with exactly the locals read here
    for used in (
        'fileset(local.repo_root, "${package}/**")',
        "for package in local.function_source_packages",
        "regexall(local.function_source_skipped, file)) == 0",
        "!anytrue([for prefix in local.function_source_left_out : startswith(file, prefix)])",
    ):
        assert used in expression, used
    skipped = skip_pattern()
    left_out = tuple(local("function_source_left_out"))
    return {
        name
        for package in local("function_source_packages")
        for path in (REPO_ROOT / package).rglob("*")
        if path.is_file()
        for name in [path.relative_to(REPO_ROOT).as_posix()]
        if not skipped.search(name) and not name.startswith(left_out)
    }


def archive_entries() -> dict[str, str]:
    """{name in the zip: the file of the checkout it is read from} of the archive_file's source blocks."""
    archive = terraform_resources(root(), "data")["archive_file.function_source"]
    assert archive["type"] == "zip"
    # file by file: neither a whole directory nor exclude patterns that something new could slip past
    assert "source_dir" not in archive
    assert "excludes" not in archive
    entries = {}
    for source in archive["source"]:
        found = re.fullmatch(r'\$\{file\("\$\{local\.repo_root\}/([^"$]+)"\)\}', source["content"])
        assert found, source
        entries[source["filename"]] = found.group(1)
    [dynamic] = archive["dynamic"]
    per_file = dynamic["source"]
    assert per_file["for_each"] == ref("local.function_source_files")
    [content] = per_file["content"]
    assert content["content"] == '${file("${local.repo_root}/${source.value}")}'
    assert content["filename"] == ref("source.value")
    for name in function_source_files():
        assert name not in entries, name
        entries[name] = name
    return entries


def test_function_source_is_the_archive_built_here() -> None:
    source = block(block(block(resource(FUNCTION), "build_config"), "source"), "storage_source")
    assert source["bucket"] == ref("google_storage_bucket.function_source.name")
    assert source["object"] == ref("google_storage_bucket_object.function_source.name")
    uploaded = resource("google_storage_bucket_object.function_source")
    # A new object name for new content is what redeploys the function after a code change.
    assert ref("data.archive_file.function_source.output_md5") in "${" + uploaded["name"].split("${", 1)[1]
    assert uploaded["source"] == ref("data.archive_file.function_source.output_path")
    assert local("repo_root") == '${abspath("${path.module}/../../..")}'
    assert (TERRAFORM_GCP / "../../..").resolve() == REPO_ROOT


def test_function_zip_is_the_gcp_package_with_the_gcp_lock_as_its_requirements(tmp_path: Path) -> None:
    entries = archive_entries()

    # the Cloud Function's lock, never the root requirements.txt (the Azure app's)
    assert entries["requirements.txt"] == "requirements/gcp.txt"
    assert entries["main.py"] == "main.py"
    # the same names as scripts/build_function_package.py's GCP zip, read from the same files
    gcp = CLOUDS["gcp"]
    assert set(entries) == set(build(gcp, tmp_path / gcp.zip_name))
    assert dict(package_files(gcp)) == {REPO_ROOT / source: name for name, source in entries.items()}


def test_function_zip_holds_nothing_of_the_other_apps_or_the_workspace() -> None:
    entries = archive_entries()

    assert {"functions/gcp_app/entry.py", "functions/core/process.py", "wire/transports/pubsub/__init__.py"} <= set(
        entries
    )
    for unwanted in ("functions/azure_app/", "functions/local_app/", "agent/", "simulator/", "mbridge/", "tests/"):
        assert not [name for name in entries if name.startswith(unwanted)], unwanted
    assert not {"function_app.py", "host.json", "pyproject.toml"} & set(entries)
    assert not [name for name in entries if "__pycache__" in name or name.endswith((".pyc", ".db"))]


def test_skip_pattern_leaves_out_caches_and_databases_only() -> None:
    skipped = skip_pattern()
    for name in ("wire/__pycache__/model.cpython-311.pyc", "functions/x.pyc", "wire/a.db-wal", "functions/s.db"):
        assert skipped.search(name), name
    for name in ("wire/model.py", "wire/schemas/envelope.json", "functions/dbx.py", "functions/pyc.py"):
        assert not skipped.search(name), name


def test_source_bucket_is_private_and_versioned() -> None:
    bucket = resource("google_storage_bucket.function_source")
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert block(bucket, "versioning")["enabled"] is True


# ---------------------------------------------------------------- Firestore


def firestore_store_source() -> str:
    return (REPO_ROOT / "functions" / "gcp_app" / "firestore_store.py").read_text(encoding="utf-8")


def firestore_audit_source() -> str:
    return (REPO_ROOT / "functions" / "gcp_app" / "firestore_audit.py").read_text(encoding="utf-8")


def test_firestore_database_is_native_and_protected() -> None:
    database = resource("google_firestore_database.main")
    assert database["type"] == "FIRESTORE_NATIVE"
    assert database["location_id"] == ref("var.firestore_location")
    assert database["delete_protection_state"] == "DELETE_PROTECTION_ENABLED"
    assert database["point_in_time_recovery_enablement"] == "POINT_IN_TIME_RECOVERY_ENABLED"
    assert default("firestore_collection_prefix") == settings.DEFAULT_PREFIX


def test_firestore_has_exactly_the_two_audit_indexes_the_queries_need() -> None:
    indexes = of_type("google_firestore_index")
    found = {
        (
            resolved(body["collection"]),
            tuple((field["field_path"], field["order"]) for field in body["fields"]),
        )
        for body in indexes.values()
    }
    assert found == {
        ("mbridge_audit", (("vm", "ASCENDING"), ("recorded_at", "ASCENDING"))),
        ("mbridge_audit", (("event_id_lower", "ASCENDING"), ("recorded_at", "ASCENDING"))),
    }
    assert all(body["database"] == ref("google_firestore_database.main.name") for body in indexes.values())
    # The audit log's queries filter on these fields and order by recorded_at.
    source = firestore_audit_source()
    assert 'client.collection(f"{prefix}audit")' in source
    # a field is named by its text or by a constant of the audit codec
    filtered = {
        literal or getattr(audit_codec, constant)
        for literal, constant in re.findall(r'FieldFilter\((?:"(\w+)"|(\w+)), "=="', source)
    }
    assert {"vm", "event_id_lower"} <= filtered
    assert 'order_by("recorded_at")' in source


def test_done_claims_expire_through_a_ttl_field() -> None:
    field = resource("google_firestore_field.claims_ttl")
    assert resolved(field["collection"]) == "mbridge_claims"
    assert field["field"] == "expire_at"
    assert field["ttl_config"] == [{}]
    source = firestore_store_source()
    assert 'client.collection(f"{prefix}claims")' in source
    assert '"expire_at": now + CLAIM_RETENTION' in source


# ---------------------------------------------------------------- IAM


def test_no_primitive_roles_and_no_public_members_anywhere() -> None:
    for parsed in (root(), module()):
        for body in resources(parsed).values():
            for text in strings(body):
                assert text not in PRIMITIVE_ROLES, text
                assert not any(member in text for member in PUBLIC_MEMBERS), text


def test_project_level_grants_carry_a_condition_or_are_the_drainer_role() -> None:
    # Authoritative project bindings would also strip everyone else's grants of the role.
    assert not of_type("google_project_iam_binding")
    assert not of_type("google_project_iam_policy")
    members = of_type("google_project_iam_member")
    assert members
    for key, body in members.items():
        if body["role"] == ref("google_project_iam_custom_role.drainer.name"):
            continue
        if key == "google_project_iam_member.function_instance_reader":
            continue  # compute.instances.list alone, which IAM checks on the project (no name to narrow)
        if key == "google_project_iam_member.build_log_writer":
            continue  # Cloud Logging offers logWriter on no narrower resource
        if key == "google_project_iam_member.function_telemetry":
            continue  # nor do Cloud Trace and Cloud Monitoring their writers (and only with telemetry on)
        condition = block(body, "condition")
        assert condition["expression"].strip(), key


def test_firestore_grant_is_limited_to_the_database() -> None:
    grant = resource("google_project_iam_member.function_firestore")
    assert grant["role"] == "roles/datastore.user"
    assert block(grant, "condition")["expression"] == (
        'resource.name == "projects/${var.project_id}/databases/${google_firestore_database.main.name}"'
    )


# What each Compute Engine call of functions/gcp_app/compute.py needs, as the API reference lists
# it: the permission on the resource of the path, and for addInstances/removeInstances also
# compute.instances.use on every instance named in the request body.
INSTANCE_USE_PERMISSION = "compute.instances.use"
COMPUTE_CALLS = {
    "instanceGroups.listInstances": {compute.LIST_PERMISSION},
    "instanceGroups.addInstances": {compute.UPDATE_PERMISSION, INSTANCE_USE_PERMISSION},
    "instanceGroups.removeInstances": {compute.UPDATE_PERMISSION, INSTANCE_USE_PERMISSION},
    "zoneOperations.wait": {compute.OPERATIONS_PERMISSION},
    "instances.performMaintenance": {compute.MAINTENANCE_PERMISSION},
}


def compute_calls_of_the_adapter() -> set[str]:
    """The Compute Engine methods compute.py calls, named as in the API reference."""
    source = (REPO_ROOT / "functions" / "gcp_app" / "compute.py").read_text(encoding="utf-8")
    names = {
        "list_instances": "instanceGroups.listInstances",
        "add_instances_unary": "instanceGroups.addInstances",
        "remove_instances_unary": "instanceGroups.removeInstances",
        "client.wait": "zoneOperations.wait",
        "perform_maintenance_unary": "instances.performMaintenance",
    }
    return {method for call, method in names.items() if f"{call}(" in source}


@pytest.mark.parametrize("method", sorted(COMPUTE_CALLS))
def test_drainer_role_holds_what_each_compute_call_needs(method: str) -> None:
    assert method in compute_calls_of_the_adapter(), f"compute.py no longer calls {method}"
    permissions = set(resource("google_project_iam_custom_role.drainer")["permissions"])
    assert COMPUTE_CALLS[method] <= permissions, COMPUTE_CALLS[method] - permissions


def test_drainer_role_holds_nothing_else() -> None:
    role = resource("google_project_iam_custom_role.drainer")
    assert role["role_id"] == "mbridgeDrainer"
    assert compute_calls_of_the_adapter() == set(COMPUTE_CALLS)
    assert sorted(role["permissions"]) == sorted(set().union(*COMPUTE_CALLS.values()))
    grant = resource("google_project_iam_member.function_drainer")
    assert grant["member"] == "serviceAccount:${google_service_account.function.email}"
    assert block(grant, "condition")["expression"] == ref("local.drainer_condition")


def render_list(name: str, **values: Any) -> list[str]:
    """The strings of a `[for X in local.Y : "..."]` local, for the given values of local.Y and vars."""
    match = re.fullmatch(r'\$\{\[for (\w+) in local\.(\w+) : "(.*)"\]\}', local(name), re.DOTALL)
    assert match, local(name)
    item, source, template = match.groups()
    rendered = []
    for value in values[source]:
        text = template.replace(f'${{split("/", {item})[0]}}', value.split("/")[0])
        text = text.replace(f'${{split("/", {item})[1]}}', value.split("/")[-1])
        text = text.replace(f"${{{item}}}", value).replace("${var.project_id}", values["project_id"])
        assert "${" not in text, text
        rendered.append(text)
    return rendered


def drainer_condition(project_id: str, groups: list[str], maintenance_zones: list[str]) -> str:
    """local.drainer_condition as IAM receives it, for these groups and zones."""
    # local.drainer_instance_zones: the groups' zones and the maintenance zones
    zones_expression = local("drainer_instance_zones")
    assert zones_expression == (
        '${distinct(concat([for group in local.instance_groups : split("/", group)[0]], local.maintenance_zones))}'
    )
    zones = list(dict.fromkeys([group.split("/")[0] for group in groups] + maintenance_zones))
    lists = {
        "drainer_group_names": render_list("drainer_group_names", project_id=project_id, instance_groups=groups),
        "drainer_zone_prefixes": render_list(
            "drainer_zone_prefixes", project_id=project_id, drainer_instance_zones=zones
        ),
    }
    text = local("drainer_condition")
    text = re.sub(r'\$\{join\(" \|\| ", local\.(\w+)\)\}', lambda match: " || ".join(lists[match.group(1)]), text)
    outer = re.fullmatch(r'\$\{join\(" && ", \[(.*)\]\)\}', text, re.DOTALL)
    assert outer, text
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', outer.group(1))
    return " && ".join(part.replace('\\"', '"') for part in parts)


def admits(condition: str, resource_type: str, name: str) -> bool:
    """Evaluates the CEL subset the drainer condition uses: ==, !=, startsWith, &&, || and brackets."""
    assert set(re.findall(r"resource\.\w+", condition)) <= {"resource.type", "resource.name"}
    python = condition.replace("resource.type", "r_type").replace("resource.name", "r_name")
    python = python.replace(".startsWith(", ".startswith(").replace("&&", " and ").replace("||", " or ")
    return bool(eval(python, {"__builtins__": {}}, {"r_type": resource_type, "r_name": name}))  # noqa: S307


def test_drainer_condition_admits_the_configured_groups_and_their_instances() -> None:
    # GIVEN the example's group, another group in another zone, and one more maintenance zone
    project = "p-1234"
    groups = ["europe-west1-b/mbridge-example", "europe-west1-c/web-c"]
    condition = drainer_condition(project, groups, ["europe-west1-d"])
    group_type, instance_type = "compute.googleapis.com/InstanceGroup", "compute.googleapis.com/Instance"
    # THEN list/update pass on exactly the configured groups
    assert admits(condition, group_type, f"projects/{project}/zones/europe-west1-b/instanceGroups/mbridge-example")
    assert admits(condition, group_type, f"projects/{project}/zones/europe-west1-c/instanceGroups/web-c")
    assert not admits(condition, group_type, f"projects/{project}/zones/europe-west1-b/instanceGroups/other")
    assert not admits(condition, group_type, "projects/other/zones/europe-west1-c/instanceGroups/web-c")
    # AND compute.instances.use passes on the instances such a group holds (its own zone), so that
    # addInstances/removeInstances succeed, and performMaintenance on the maintenance zones
    for zone in ("europe-west1-b", "europe-west1-c", "europe-west1-d"):
        assert admits(condition, instance_type, f"projects/{project}/zones/{zone}/instances/web-0")
    assert not admits(condition, instance_type, f"projects/{project}/zones/us-east1-b/instances/web-0")
    assert not admits(condition, instance_type, "projects/other/zones/europe-west1-b/instances/web-0")
    # AND zone operations (no resource name documented for conditions) are not narrowed
    assert admits(condition, "compute.googleapis.com/ZoneOperation", f"projects/{project}/zones/x/operations/o")


def test_drainer_condition_admits_group_zones_even_without_them_as_maintenance_zones() -> None:
    # GIVEN maintenance zones that leave out a group's zone (MBRIDGE_MAINTENANCE_ZONES is the
    # deployment's, the condition must not depend on it to restore a VM)
    condition = drainer_condition("p-1234", ["europe-west1-c/web-c"], ["europe-west1-d"])
    # THEN an instance of the group's zone can still be added back
    assert admits(condition, "compute.googleapis.com/Instance", "projects/p-1234/zones/europe-west1-c/instances/a")


def members_of(account: str) -> dict[str, Body]:
    member = f"serviceAccount:${{google_service_account.{account}.email}}"
    return {key: body for key, body in iam_grants().items() if body.get("member") == member}


def test_function_account_holds_only_its_adapters_roles() -> None:
    grants = {(key.split(".")[0], body["role"]) for key, body in members_of("function").items()}
    assert grants == {
        ("google_project_iam_member", "roles/datastore.user"),
        ("google_project_iam_member", ref("google_project_iam_custom_role.drainer.name")),
        ("google_project_iam_member", ref("google_project_iam_custom_role.instance_reader[each.value].name")),
        # the telemetry exporters' roles, granted only with telemetry on (test_telemetry_roles_...)
        ("google_project_iam_member", ref("each.value")),
        ("google_pubsub_topic_iam_member", "roles/pubsub.publisher"),
        ("google_secret_manager_secret_iam_member", "roles/secretmanager.secretAccessor"),
    }
    publisher = resource("google_pubsub_topic_iam_member.function_commands_publisher")
    assert (publisher["count"], publisher["topic"]) == (
        ref("var.commands_shards"),
        ref("google_pubsub_topic.commands[count.index].name"),
    )


BUILD_ROLES_DOCUMENTED = {"roles/logging.logWriter", "roles/artifactregistry.writer", "roles/storage.objectViewer"}


def test_function_is_built_by_a_build_account_of_its_own() -> None:
    # GIVEN the function's build settings
    build = block(resource(FUNCTION), "build_config")
    # THEN Cloud Build runs as the dedicated account, named as the API wants it
    # (projects/<project>/serviceAccounts/<email>: the account resource's id), not the default
    # compute account, which new organisations grant no build rights
    assert build["service_account"] == ref("google_service_account.build.id")
    assert resource("google_service_account.build")["account_id"] == "mbridge-build"
    assert build["service_account"] != block(resource(FUNCTION), "service_config")["service_account_email"]
    # AND the image goes to the function's own Docker repository, in the function's region
    assert build["docker_repository"] == ref("google_artifact_registry_repository.function.id")
    repository = resource("google_artifact_registry_repository.function")
    assert (repository["format"], repository["location"]) == ("DOCKER", ref("var.region"))
    # AND the account's roles are in place before the first build
    depends_on = set(resource(FUNCTION)["depends_on"])
    assert {f"${{{key}}}" for key in members_of("build")} <= depends_on


def test_build_account_holds_exactly_the_documented_roles_on_the_narrowest_resources() -> None:
    grants = members_of("build")
    assert {body["role"] for body in grants.values()} == BUILD_ROLES_DOCUMENTED
    where = {(key.split(".")[0], body["role"]) for key, body in grants.items()}
    assert where == {
        ("google_project_iam_member", "roles/logging.logWriter"),
        ("google_artifact_registry_repository_iam_member", "roles/artifactregistry.writer"),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer"),
        ("google_project_iam_member", "roles/storage.objectViewer"),
    }
    writer = resource("google_artifact_registry_repository_iam_member.build_writer")
    assert writer["repository"] == ref("google_artifact_registry_repository.function.name")
    reader = resource("google_storage_bucket_iam_member.build_source_reader")
    assert reader["bucket"] == ref("google_storage_bucket.function_source.name")
    # Cloud Functions' own copy of the source: that bucket only, by an IAM condition
    staged = resource("google_project_iam_member.build_staged_source_reader")
    assert block(staged, "condition")["expression"] == (
        'resource.name == "projects/_/buckets/${local.functions_sources_bucket}" || '
        'resource.name.startsWith("projects/_/buckets/${local.functions_sources_bucket}/")'
    )
    assert local("functions_sources_bucket") == "gcf-v2-sources-${data.google_project.this.number}-${var.region}"


def test_push_invoker_may_only_invoke_the_functions_service() -> None:
    grants = members_of("push_invoker")
    assert sorted(grants) == [
        "google_cloud_run_v2_service_iam_member.push_invoker",
        "google_cloud_run_v2_service_iam_member.push_invoker_central",
    ]
    invoker = grants["google_cloud_run_v2_service_iam_member.push_invoker"]
    assert invoker["role"] == "roles/run.invoker"
    assert invoker["name"] == ref(f"{FUNCTION}.service_config[0].service")
    # and the control plane's two functions, each on its own service
    central = grants["google_cloud_run_v2_service_iam_member.push_invoker_central"]
    assert central["role"] == "roles/run.invoker"
    assert central["for_each"] == ref(CENTRAL_FUNCTIONS)
    assert central["name"] == "${each.value.service_config[0].service}"


# ---------------------------------------------------------------- the control plane's path

CENTRAL_FUNCTIONS = "google_cloudfunctions2_function.central"
CENTRAL_LOG_METHODS = {
    "compute.instances.upcomingMaintenance",
    "compute.instances.migrateOnHostMaintenance",
    "compute.instances.terminateOnHostMaintenance",
    "compute.instances.hostError",
    "compute.instances.preempted",
    "compute.instances.automaticRestart",
}


def central_functions() -> dict[str, Any]:
    """The `central_functions` map as written (python-hcl2 keeps the conditional as text)."""
    text = local("central_functions")
    log, tick = re.split(r"\btick\s*=\s*\{", re.split(r"\blog\s*=\s*\{", text, maxsplit=1)[1], maxsplit=1)
    return {"log": log, "tick": tick}


def test_the_central_path_is_one_switch_on_by_default() -> None:
    # A variable turns all of it off; it is on unless set so
    assert default("central_reports") is True
    assert local("central_count") == "${var.central_reports ? 1 : 0}"
    assert local("central_functions").startswith("${var.central_reports ? {")
    for key, body in resources().items():
        if key.split(".")[0] != "google_cloud_run_v2_service_iam_member" and "central" in key.split(".")[1]:
            assert body.get("count") == ref("local.central_count") or body.get("for_each") in (
                ref("local.central_functions"),
                ref(CENTRAL_FUNCTIONS),
            ), key


def test_the_sink_selects_host_maintenance_system_events_into_maintenance_central() -> None:
    sink = resource("google_logging_project_sink.central")
    assert sink["destination"] == "pubsub.googleapis.com/${google_pubsub_topic.central[0].id}"
    assert resource("google_pubsub_topic.central")["name"] == "maintenance-central"
    # a writer identity of the sink's own, not the shared cloud-logs account
    assert sink["unique_writer_identity"] is True
    assert sink["filter"] == ref("local.central_log_filter")
    log_filter = local("central_log_filter")
    assert '"logName:\\"cloudaudit.googleapis.com%2Fsystem_event\\""' in log_filter
    assert '"resource.type=\\"gce_instance\\""' in log_filter
    assert set(re.findall(r'"(compute\.instances\.\w+)"', log_filter)) == CENTRAL_LOG_METHODS


def test_only_the_sink_writer_may_publish_on_maintenance_central() -> None:
    # GIVEN every grant of the root on the central topic
    on_topic = {
        key: body
        for key, body in of_type("google_pubsub_topic_iam_member").items()
        if body["topic"] == ref("google_pubsub_topic.central[0].name")
    }
    # THEN one: publisher for the sink's writer identity (docs/security.md, "Reports from the control plane")
    assert list(on_topic) == ["google_pubsub_topic_iam_member.central_sink_publisher"]
    publisher = on_topic["google_pubsub_topic_iam_member.central_sink_publisher"]
    assert publisher["role"] == "roles/pubsub.publisher"
    assert publisher["member"] == ref("google_logging_project_sink.central[0].writer_identity")
    # AND the sink's writer is granted nothing else
    writer = ref("google_logging_project_sink.central[0].writer_identity")
    assert [key for key, body in iam_grants().items() if body.get("member") == writer] == list(on_topic)
    # AND no topic binding is authoritative (it would strip or hide other members)
    assert not of_type("google_pubsub_topic_iam_binding")
    assert not of_type("google_pubsub_topic_iam_policy")


def test_only_cloud_scheduler_publishes_the_tick() -> None:
    job = resource("google_cloud_scheduler_job.central_tick")
    assert job["schedule"] == "* * * * *"
    assert block(job, "pubsub_target")["topic_name"] == ref("google_pubsub_topic.central_tick[0].id")
    assert resource("google_pubsub_topic.central_tick")["name"] == "maintenance-central-tick"
    on_topic = {
        key: body
        for key, body in of_type("google_pubsub_topic_iam_member").items()
        if body["topic"] == ref("google_pubsub_topic.central_tick[0].name")
    }
    assert list(on_topic) == ["google_pubsub_topic_iam_member.central_tick_publisher"]
    assert on_topic["google_pubsub_topic_iam_member.central_tick_publisher"]["member"] == ref(
        "local.cloud_scheduler_service_agent"
    )
    assert "@gcp-sa-cloudscheduler.iam.gserviceaccount.com" in local("cloud_scheduler_service_agent")


def test_the_central_functions_are_the_events_functions_build_with_their_entry_points() -> None:
    entries = central_functions()
    assert re.search(r'entry_point\s*=\s*"on_central_log_entry"', entries["log"])
    assert re.search(r'entry_point\s*=\s*"on_central_tick"', entries["tick"])
    # one sweep at a time
    assert re.search(r"max_instances\s*=\s*1\b", entries["tick"])
    central = resource(CENTRAL_FUNCTIONS)
    events = resource(FUNCTION)
    build, events_build = block(central, "build_config"), block(events, "build_config")
    assert build["entry_point"] == "${each.value.entry_point}"
    for key in ("runtime", "service_account", "docker_repository", "source"):
        assert build[key] == events_build[key], key
    service, events_service = block(central, "service_config"), block(events, "service_config")
    for key in ("service_account_email", "ingress_settings", "timeout_seconds", "secret_environment_variables"):
        assert service[key] == events_service[key], key
    assert service["environment_variables"].startswith(
        "${merge(local.function_environment, local.function_policy_environment"
    )


def test_the_central_log_entries_are_pushed_retried_then_dead_lettered() -> None:
    push = resource("google_pubsub_subscription.central")
    assert push["topic"] == ref("google_pubsub_topic.central[0].id")
    config = block(push, "push_config")
    token = block(config, "oidc_token")
    assert token["service_account_email"] == ref("google_service_account.push_invoker.email")
    assert token["audience"] == ref(f'{CENTRAL_FUNCTIONS}["log"].service_config[0].uri')
    assert config["push_endpoint"].startswith(f'${{{CENTRAL_FUNCTIONS}["log"].service_config[0].uri}}/')
    dead_letter = block(push, "dead_letter_policy")
    assert dead_letter["dead_letter_topic"] == ref("google_pubsub_topic.central_dead_letters[0].id")
    assert dead_letter["max_delivery_attempts"] == ref("var.max_delivery_attempts")
    assert push["ack_deadline_seconds"] >= block(resource(CENTRAL_FUNCTIONS), "service_config")["timeout_seconds"]
    # the service agent can move them to the dead-letter topic, and the dead letters stay readable
    publisher = resource("google_pubsub_topic_iam_member.central_dead_letter_publisher")
    assert (publisher["topic"], publisher["member"]) == (
        ref("google_pubsub_topic.central_dead_letters[0].name"),
        ref("local.pubsub_service_agent"),
    )
    subscriber = resource("google_pubsub_subscription_iam_member.central_dead_letter_subscriber")
    assert (subscriber["subscription"], subscriber["member"]) == (
        ref("google_pubsub_subscription.central[0].name"),
        ref("local.pubsub_service_agent"),
    )
    inspect = resource("google_pubsub_subscription.central_dead_letters_inspect")
    assert inspect["topic"] == ref("google_pubsub_topic.central_dead_letters[0].id")


def test_a_tick_is_pushed_to_on_central_tick_and_never_outlives_ten_minutes() -> None:
    push = resource("google_pubsub_subscription.central_tick")
    assert push["topic"] == ref("google_pubsub_topic.central_tick[0].id")
    token = block(block(push, "push_config"), "oidc_token")
    assert token["audience"] == ref(f'{CENTRAL_FUNCTIONS}["tick"].service_config[0].uri')
    # a tick the function did not take is dropped once the next ones are due, never dead-lettered
    assert push["message_retention_duration"] == "600s"
    assert "dead_letter_policy" not in push


def test_the_tick_lists_instances_with_the_instance_readers_list_permission() -> None:
    # instances.aggregatedList needs compute.instances.list on each trusted project: the role the
    # instance directory already holds, nothing new
    assert "compute.instances.list" in resource("google_project_iam_custom_role.instance_reader")["permissions"]


def test_agents_publish_events_and_read_their_own_commands_only() -> None:
    # GIVEN the accounts the agents run as: each example VM's, and the example group's shared one,
    # keyed apart from every VM name (names have no spaces)
    assert local("agent_accounts") == (
        "${merge({for name, account in google_service_account.agent : name => account.email}, "
        '{for account in google_service_account.mig_agent : "group ${var.mig_name}" => account.email})}'
    )
    # THEN each publishes events, and that is the one grant any of them holds beside its commands
    member = "serviceAccount:${each.value}"
    grants = {key: body for key, body in resources().items() if body.get("member") == member}
    assert list(grants) == ["google_pubsub_topic_iam_member.agent_events_publisher"]
    publisher = grants["google_pubsub_topic_iam_member.agent_events_publisher"]
    assert publisher["for_each"] == ref("local.agent_accounts")
    assert publisher["topic"] == ref("google_pubsub_topic.events.name")
    assert publisher["role"] == "roles/pubsub.publisher"
    for account in ("google_service_account.agent", "google_service_account.mig_agent"):
        assert not [key for key, body in resources().items() if account in str(body.get("member", ""))], account


def test_pubsub_service_agent_can_dead_letter() -> None:
    agent = local("pubsub_service_agent")
    # the agent the deployment asks for, or its documented address should the API answer without an email
    assert agent == (
        "serviceAccount:${coalesce(google_project_service_identity.pubsub.email, "
        '"service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com")}'
    )
    publisher = resource("google_pubsub_topic_iam_member.dead_letter_publisher")
    assert (publisher["topic"], publisher["role"], publisher["member"]) == (
        ref("google_pubsub_topic.dead_letters.name"),
        "roles/pubsub.publisher",
        ref("local.pubsub_service_agent"),
    )
    subscriber = resource("google_pubsub_subscription_iam_member.dead_letter_subscriber")
    assert (subscriber["subscription"], subscriber["role"], subscriber["member"]) == (
        ref(f"{PUSH}.name"),
        "roles/pubsub.subscriber",
        ref("local.pubsub_service_agent"),
    )


# ---------------------------------------------------------------- the example VMs


VM = "google_compute_instance.vm"
AGENT_FILES = {
    "startup-script": "gce-startup.sh",
    "mbridge-install-script": "install-agent.sh",
    "mbridge-agent-unit": "mbridge-agent.service",
}


def vm_metadata() -> Body:
    """The metadata every example VM carries (local.agent_metadata)."""
    assert resource(VM)["metadata"] == ref("local.agent_metadata")
    metadata: Body = local("agent_metadata")
    return metadata


def test_vms_run_the_agent_from_the_infra_agent_files() -> None:
    metadata = vm_metadata()
    for key, file_name in AGENT_FILES.items():
        match = re.fullmatch(r'\$\{file\("\$\{path\.module\}/([^"]+)"\)\}', metadata[key])
        assert match, metadata[key]
        assert (TERRAFORM_GCP / match.group(1)).resolve() == AGENT_INSTALL / file_name
    assert metadata["mbridge-package"] == ref("var.agent_package")


def test_the_agent_package_is_a_wheel_with_its_hash_and_required_with_vms() -> None:
    # GIVEN agent_package; THEN it has no default and takes only a wheel URL with its sha256
    assert_agent_package_is_pinned(terraform_variables(root())["agent_package"], "agent-pubsub")
    # AND the VMs refuse to be planned without one
    [precondition] = resource(VM)["lifecycle"][0]["precondition"]
    assert precondition["condition"] == '${var.agent_package != ""}'
    assert "agent_package is required" in precondition["error_message"]


def test_an_agent_change_updates_metadata_in_place_and_recreates_no_vm() -> None:
    # GIVEN the example VMs: one instance resource per VM, the agent files in its own metadata
    vm = resource(VM)
    assert vm["for_each"] == "${toset(var.vm_names)}"
    # THEN no instance template holds them: a template cannot change, so a new agent file would
    # replace it and re-create every VM made from it at once. The one template is the opt-in
    # managed group's, whose update policy replaces its members one at a time (test_terraform_gcp_mig.py)
    assert "source_instance_template" not in vm
    assert not of_type("google_compute_instance_from_template")
    assert set(of_type("google_compute_instance_template")) == {"google_compute_instance_template.mig"}
    assert set(of_type("google_compute_instance_group_manager")) == {"google_compute_instance_group_manager.mig"}
    assert not of_type("google_compute_region_instance_group_manager")
    # AND the startup script is an ordinary metadata key, which the provider updates in place;
    # metadata_startup_script would re-create the VM on every change of the script
    assert "metadata_startup_script" not in vm
    assert set(AGENT_FILES) <= set(vm_metadata())
    # AND nothing that is replaced on change (the boot disk's image, the name) follows the agent files
    agent_references = ("local.agent", "var.agent_package", "file(")
    for key, value in vm.items():
        if key not in ("metadata", "lifecycle"):  # a precondition reads the package, it replaces nothing
            assert not any(reference in text for text in strings(value) for reference in agent_references), key


def test_install_files_the_vms_use_are_in_the_repository() -> None:
    for name in AGENT_FILES.values():
        assert (AGENT_INSTALL / name).is_file(), f"infra/agent/{name} is referenced by the VMs' metadata"


def test_agent_environment_selects_the_pubsub_transport_on_gce() -> None:
    assert vm_metadata()["mbridge-agent-env"] == ref("local.agent_environment")
    text = local("agent_environment")
    lines = re.findall(r'"(MBRIDGE_[A-Z_]+)=([^"]*)\\n"', text)
    values = dict(lines)
    assert values["MBRIDGE_CLOUD"] == "gce"
    assert values["MBRIDGE_TRANSPORT"] == "pubsub"
    assert values["MBRIDGE_PUBSUB_PROJECT"] == ref("var.project_id")
    assert values["MBRIDGE_LISTEN"] == "0.0.0.0:9797"
    assert values["MBRIDGE_VERIFY_KEY"] == ref("local.verify_key")
    assert "MBRIDGE_INSECURE_UNSIGNED_COMMANDS" not in values
    agent_config = (REPO_ROOT / "agent" / "config.py").read_text(encoding="utf-8")
    assert all(f'"{name}"' in agent_config for name in values), "an environment variable the agent does not read"


def test_vms_are_shielded_private_and_live_migrate() -> None:
    vm = resource(VM)
    assert "access_config" not in block(vm, "network_interface")
    shielded = block(vm, "shielded_instance_config")
    assert shielded == {"enable_secure_boot": True, "enable_vtpm": True, "enable_integrity_monitoring": True}
    assert block(vm, "scheduling")["on_host_maintenance"] == "MIGRATE"
    metadata = vm_metadata()
    assert (metadata["block-project-ssh-keys"], metadata["serial-port-enable"]) == ("true", "false")
    account = block(vm, "service_account")
    assert account["email"] == ref("google_service_account.agent[each.value].email")
    assert account["scopes"] == ["cloud-platform"]


def test_instance_group_holds_the_vms_the_function_drains() -> None:
    group = resource("google_compute_instance_group.example")
    assert (group["name"], group["zone"]) == (ref("var.instance_group_name"), ref("var.zone"))
    membership = resource("google_compute_instance_group_membership.example")
    assert membership["for_each"] == ref(VM)
    assert membership["instance_group"] == ref("google_compute_instance_group.example.name")
    assert resource(VM)["zone"] == group["zone"]


def test_health_checks_reach_the_agent_port_only() -> None:
    rule = resource("google_compute_firewall.health_checks")
    assert rule["direction"] == "INGRESS"
    assert sorted(rule["source_ranges"]) == ["130.211.0.0/22", "35.191.0.0/16"]
    allowed = block(rule, "allow")
    assert (allowed["protocol"], allowed["ports"]) == ("tcp", ["9797"])
    assert rule["target_tags"] == ref("local.network_tags")


# ---------------------------------------------------------------- variables and outputs


@pytest.mark.parametrize("parsed", [root, module], ids=["root", "module"])
def test_every_variable_has_a_description_and_a_type(parsed: Any) -> None:
    variables = terraform_variables(parsed())
    assert variables
    for name, body in variables.items():
        assert str(body.get("description", "")).strip(), f"var.{name} has no description"
        assert body.get("type"), f"var.{name} has no type"


def test_outputs_are_described_and_cover_what_operators_need() -> None:
    outputs = terraform_outputs(root())
    assert all(str(body.get("description", "")).strip() for body in outputs.values())
    assert {
        "events_topic_id",
        "commands_topic_id",
        "commands_topics",
        "dead_letter_topic_id",
        "push_subscription_id",
        "function_name",
        "function_uri",
        "function_service_account_email",
        "push_invoker_service_account_email",
        "agent_service_account_emails",
        "firestore_database_name",
        "example_vm_names",
        "command_subscription_names",
        "identity_audience",
    } <= set(outputs)
    assert outputs["command_subscription_names"]["value"] == (
        "${{for name, subscription in module.vm_commands : name => subscription.subscription_name}}"
    )
    assert "subscription_name" in terraform_outputs(module())


def test_the_webhook_url_comes_from_a_secret_only_its_function_reads() -> None:
    # GIVEN no webhook secret (the default) THEN no notices and no grant
    assert default("webhook_url_secret_id") is None
    grant = resource("google_secret_manager_secret_iam_member.webhook_url")
    assert grant["count"] == "${var.webhook_url_secret_id == null ? 0 : 1}"
    # AND given one, the function's runtime account alone may read it
    assert grant["role"] == "roles/secretmanager.secretAccessor"
    assert grant["member"] == "serviceAccount:${google_service_account.function.email}"
    # AND the URL is never a plain variable: the template and the filter are, the URL is not
    environment = local("function_environment")
    assert settings.ENV_WEBHOOK_URL not in environment
    assert environment[settings.ENV_WEBHOOK_TEMPLATE] == ref("var.webhook_template")
    assert environment[settings.ENV_WEBHOOK_ACTIONS] == ref("var.webhook_actions")


def test_every_alert_the_functions_raise_is_counted_by_a_log_based_metric() -> None:
    # GIVEN the alert values the Cloud Functions' lines carry (docs/operations.md, the `alert` field)
    raised = {"agent-silent", "proof-reused", "upcoming-unread"}
    functions = Path(__file__).resolve().parents[2] / "functions"
    sources = "\n".join(path.read_text(encoding="utf-8") for path in functions.rglob("*.py"))
    assert all(f'"{alert}"' in sources for alert in raised)

    # THEN each is counted by a metric of the functions' lines carrying it, by VM
    metrics = {metric["alert"]: metric for metric in local("alert_metrics").values()}
    assert set(metrics) == raised
    (metric,) = of_type("google_logging_metric").values()
    assert metric["for_each"] == "${local.alert_metrics}"
    assert "labels.alert=" in str(metric["filter"])
    assert "cloud_run_revision" in str(metric["filter"])
    assert metric["label_extractors"] == {"vm": "EXTRACT(labels.vm)"}


# ---------------------------------------------------------------- a fresh project (issue 29, item 7)


def test_the_pubsub_service_agent_is_created_before_anything_is_granted_to_it() -> None:
    # GIVEN a project where Pub/Sub was just enabled: its service agent may not exist yet, and a
    # binding to an account that does not exist fails. THEN the deployment asks for it
    # (services.generateServiceIdentity, google-beta's google_project_service_identity) once the
    # API is on
    identity = resource("google_project_service_identity.pubsub")
    assert identity["provider"] == "google-beta"
    assert (identity["project"], identity["service"]) == (ref("var.project_id"), "pubsub.googleapis.com")
    assert ref("google_project_service.apis") in identity["depends_on"]
    # AND every grant to the agent names it through that resource, so none is made before it
    agent = local("pubsub_service_agent")
    assert "google_project_service_identity.pubsub.email" in agent
    member = ref("local.pubsub_service_agent")
    grants = {key: body for key, body in iam_grants().items() if body.get("member") == member}
    assert {
        "google_pubsub_topic_iam_member.dead_letter_publisher",
        "google_pubsub_subscription_iam_member.dead_letter_subscriber",
        "google_pubsub_topic_iam_member.central_dead_letter_publisher",
        "google_pubsub_subscription_iam_member.central_dead_letter_subscriber",
        "google_service_account_iam_member.pubsub_token_creator",
        "google_kms_crypto_key_iam_member.pubsub_cmek",
    } <= set(grants)
    for key, body in iam_grants().items():
        assert "gcp-sa-pubsub" not in str(body.get("member", "")), key
    # AND the google-beta provider is pinned with the google one, and configured alike
    providers = root()["terraform"][0]["required_providers"][0]
    assert providers["google-beta"] == {"source": "hashicorp/google-beta", "version": providers["google"]["version"]}
    configured = {next(iter(block)): next(iter(block.values())) for block in root()["provider"]}
    assert configured["google-beta"] == configured["google"]


def test_the_functions_deploy_once_their_secret_grants_have_had_time_to_propagate() -> None:
    # GIVEN the secretAccessor grants the functions' deployments check (the signing key, the webhook URL)
    wait = resource("time_sleep.secret_access")
    # THEN a wait follows them, taken again whenever one of them is replaced
    assert set(wait["triggers"]) == {"signing_key", "webhook_url"}
    assert "google_secret_manager_secret_iam_member.signing_key.id" in wait["triggers"]["signing_key"]
    assert "google_secret_manager_secret_iam_member.webhook_url" in wait["triggers"]["webhook_url"]
    seconds = re.fullmatch(r"(\d+)s", wait["create_duration"])
    assert seconds, wait["create_duration"]
    assert int(seconds.group(1)) >= 60, wait["create_duration"]
    # AND every function is deployed after it
    for key in (FUNCTION, CENTRAL_FUNCTIONS):
        assert ref("time_sleep.secret_access") in resource(key)["depends_on"], key
    # AND the time provider is pinned
    providers = root()["terraform"][0]["required_providers"][0]
    assert providers["time"]["source"] == "hashicorp/time"
    assert re.fullmatch(r"~> 0\.\d+", providers["time"]["version"])


def test_the_offline_validation_knows_every_provider_the_root_requires() -> None:
    pins = json.loads((REPO_ROOT / "scripts" / "tfschema" / "providers.json").read_text(encoding="utf-8"))
    pinned = {pin["source"].removeprefix("registry.terraform.io/"): pin["version"] for pin in pin_list(pins)}
    for name, requirement in root()["terraform"][0]["required_providers"][0].items():
        assert requirement["source"] in pinned, name
        constraint = re.fullmatch(r"~> (\d+)\.(\d+)", requirement["version"])
        assert constraint, requirement
        version = tuple(int(part) for part in pinned[requirement["source"]].split("."))
        assert version[0] == int(constraint.group(1)), name
        assert version[1] >= int(constraint.group(2)), name


def pin_list(pins: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = pins["providers"]
    return found


# ---------------------------------------------------------------- names (issue 29, item 8)

ACCOUNT_ID = re.compile(r"[a-z](?:[-a-z0-9]{4,28}[a-z0-9])")
# Cloud Functions: a letter, then letters, digits and hyphens, not ending in a hyphen, 63 at most.
FUNCTION_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def validation_rule(name: str) -> re.Pattern[str]:
    """The first regex of var.<name>'s validation, compiled as Python reads it (RE2 and Python agree here)."""
    [validation] = terraform_variables(root())[name]["validation"]
    found = re.search(r'regex\("((?:[^"\\]|\\.)*)", ', validation["condition"])
    assert found, validation["condition"]
    return re.compile(found.group(1).replace("\\\\", "\\"))


def test_every_vm_name_the_plan_takes_gives_a_valid_service_account_id() -> None:
    rule = validation_rule("vm_names")
    template = resource("google_service_account.agent")["account_id"]
    assert "${each.value}" in template
    candidates = ["a", "ab", "a1", "a-", "a-b", "web-0", "x" * 25, "x" * 26, "x" * 27, "x" + "-" * 24 + "y"]
    taken = [name for name in candidates if rule.fullmatch(name)]
    assert {"ab", "a1", "a-b", "web-0", "x" * 26} <= set(taken)
    for name in taken:
        assert ACCOUNT_ID.fullmatch(template.replace("${each.value}", name)), name
    # the module's own rule (a Compute instance name) takes every name the root takes
    module_rule = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
    assert all(module_rule.fullmatch(name) for name in taken)


def test_every_function_name_the_plan_takes_names_valid_functions_and_a_repository() -> None:
    rule = validation_rule("function_name")
    suffixes = [
        re.search(r'name\s*=\s*"\$\{var\.function_name\}(-[a-z-]+)"', text).group(1)  # type: ignore[union-attr]
        for text in central_functions().values()
    ]
    assert suffixes == ["-central-log", "-central-tick"]
    for length in (1, 2, 30, 50, 51, 63):
        name = "f" * length
        if not rule.fullmatch(name):
            continue
        # the events function, its Artifact Registry repository (same rules, 63 at most), the central functions
        for derived in [name, *(name + suffix for suffix in suffixes)]:
            assert FUNCTION_NAME.fullmatch(derived), derived
    assert rule.fullmatch("f" * 50)


# ---------------------------------------------------------------- alerts (issue 29, item 9)


def alert_policies() -> dict[str, Body]:
    return of_type("google_monitoring_alert_policy")


def threshold(policy: Body) -> Body:
    return block(block(policy, "conditions"), "condition_threshold")


def test_alert_policies_notify_the_channels_of_one_variable() -> None:
    variable = terraform_variables(root())["alert_notification_channels"]
    assert variable["default"] == []
    assert variable["type"] == "${list(string)}"
    policies = alert_policies()
    assert policies
    for key, policy in policies.items():
        assert policy["notification_channels"] == ref("var.alert_notification_channels"), key
        assert policy["combiner"] == "OR", key
        assert str(block(policy, "documentation")["content"]).strip(), key


def test_an_alert_fires_when_the_oldest_unacked_event_gets_old() -> None:
    # GIVEN the push subscriptions that feed the functions (events; the control plane's log entries)
    backlog = resource("google_monitoring_alert_policy.backlog")
    assert backlog["for_each"] == ref("local.alert_backlog_subscriptions")
    watched = local("alert_backlog_subscriptions")
    assert "google_pubsub_subscription.functions.name" in watched
    assert "google_pubsub_subscription.central[0].name" in watched
    # THEN the condition is the subscription's oldest_unacked_message_age above a threshold
    condition = threshold(backlog)
    assert 'metric.type="pubsub.googleapis.com/subscription/oldest_unacked_message_age"' in condition["filter"]
    assert 'resource.type="pubsub_subscription"' in condition["filter"]
    assert "resource.label.subscription_id=" in condition["filter"]
    assert condition["comparison"] == "COMPARISON_GT"
    assert condition["threshold_value"] == ref("var.alert_oldest_unacked_seconds")
    # AND the threshold's default lets one retry of the backoff pass but not the dead-letter path
    assert 600 <= default("alert_oldest_unacked_seconds") <= 1800


def test_an_alert_fires_while_a_dead_letter_waits_unread() -> None:
    dead = resource("google_monitoring_alert_policy.dead_letters")
    assert dead["for_each"] == ref("local.alert_dead_letter_subscriptions")
    watched = local("alert_dead_letter_subscriptions")
    assert "google_pubsub_subscription.dead_letters_inspect.name" in watched
    assert "google_pubsub_subscription.central_dead_letters_inspect[0].name" in watched
    condition = threshold(dead)
    assert 'metric.type="pubsub.googleapis.com/subscription/num_undelivered_messages"' in condition["filter"]
    assert (condition["comparison"], condition["threshold_value"]) == ("COMPARISON_GT", 0)


def test_every_alert_the_functions_log_raises_an_alert_policy() -> None:
    policy = resource("google_monitoring_alert_policy.log_alert")
    assert policy["for_each"] == ref("google_logging_metric.alert")
    # once Cloud Monitoring knows the new metrics (it refuses a policy on an unknown one)
    assert policy["depends_on"] == [ref("time_sleep.log_metrics")]
    assert "google_logging_metric.alert" in resource("time_sleep.log_metrics")["triggers"]["metrics"]
    condition = threshold(policy)
    assert "logging.googleapis.com/user/${each.value.name}" in condition["filter"]
    assert (condition["comparison"], condition["threshold_value"]) == ("COMPARISON_GT", 0)


@pytest.fixture(scope="module")
def telemetry_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root's variables and telemetry locals alone, for `terraform console` (no provider)."""
    module = tmp_path_factory.mktemp("telemetry")
    for name in ("variables.tf", "telemetry.tf"):
        (module / name).write_text((TERRAFORM_GCP / name).read_text(encoding="utf-8"), encoding="utf-8")
    return module


@console.needs_terraform
def test_telemetry_roles_and_apis_are_granted_and_enabled_only_with_telemetry_on(telemetry_module: Path) -> None:
    # GIVEN the function deployed with MBRIDGE_TELEMETRY from var.telemetry, off by default
    assert local("function_environment")[settings.ENV_TELEMETRY] == ref("var.telemetry")
    assert default("telemetry") == "off"
    # AND the function's account granted each of local.telemetry_roles on the project, the APIs
    # enabled with local.telemetry_apis
    grant = resource("google_project_iam_member.function_telemetry")
    assert (grant["for_each"], grant["role"], grant["member"], grant["project"]) == (
        ref("local.telemetry_roles"),
        ref("each.value"),
        "serviceAccount:${google_service_account.function.email}",
        ref("var.project_id"),
    )
    assert local("apis").endswith(", local.telemetry_apis)}")
    required = {"project_id": "shop-prod"}

    def evaluated(telemetry: str) -> Any:
        return console.evaluate(
            telemetry_module, "[local.telemetry_roles, local.telemetry_apis]", {**required, "telemetry": telemetry}
        )

    # THEN off grants and enables nothing; gcp, the writers of spans and of metric points and their APIs
    assert evaluated("off") == [[], []]
    assert evaluated("gcp") == [
        ["roles/cloudtrace.agent", "roles/monitoring.metricWriter"],
        ["cloudtrace.googleapis.com", "monitoring.googleapis.com"],
    ]
    # AND another exporter's name is refused
    with pytest.raises(AssertionError, match="telemetry must be off or gcp"):
        evaluated("azure-monitor")
