"""After an Azure deployment: are the function app's Key Vault references resolved? Restart it if not.

    python3 scripts/check_keyvault_references.py --resource-group RG --name APP [--subscription ID]
        [--restart] [--attempts 5] [--wait 60] [--from-file ANSWER.json]

The app settings PUT restarts the app, and the platform resolves each `@Microsoft.KeyVault(...)`
reference then. If the function identity's role on the secret had not propagated yet, the
reference stays unresolved (the app sees the reference's text) until the app restarts or the
platform refreshes it, within 24 hours
(https://learn.microsoft.com/azure/app-service/app-service-key-vault-references, "Rotation" and
"Troubleshoot Key Vault references"). This reads each reference's status from Resource Manager,
`GET <site>/config/configreferences/appsettings` (the same list the portal's Environment variables
page shows), and, with `--restart`, restarts the app and reads again until every reference is
`Resolved` or the attempts are spent.

It runs the Azure CLI (`az rest`, `az functionapp restart`) as whoever is logged in: reading the
statuses takes Reader on the app, the restart Website Contributor (or Contributor).

Exit status: 0 every reference resolved, 1 one is not (each is printed with its status and
details), 2 the Azure CLI failed or answered something else.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_VERSION = "2022-03-01"
RESOLVED = "Resolved"

Runner = Callable[[Sequence[str]], str]


class AnswerError(Exception):
    """The Azure CLI failed, or Resource Manager answered something this script does not read."""


@dataclass(frozen=True)
class Reference:
    setting: str
    status: str
    details: str


def references_of(answer: Mapping[str, Any]) -> list[Reference]:
    """The references of one `config/configreferences/appsettings` answer, by setting name.

    Each item's `name` is the setting's name (some API versions prefix it with the site's name and a
    slash, and the `id` ends with it); `properties.status` is one of Resolved, Initialized,
    InvalidSyntax, MSINotEnabled, VaultNotFound, SecretNotFound, SecretVersionNotFound,
    AccessToKeyVaultDenied, OtherReasons, FetchTimedOut, UnauthorizedClient (ResolveStatus of
    the Microsoft.Web API)."""
    items = answer.get("value")
    if not isinstance(items, list):
        raise AnswerError(f"no `value` list in the answer: {json.dumps(answer)[:200]}")
    found = []
    for item in items:
        if not isinstance(item, Mapping):
            raise AnswerError(f"not a reference: {item!r}")
        name = str(item.get("name") or item.get("id") or "").rsplit("/", 1)[-1]
        properties = item.get("properties") or {}
        found.append(
            Reference(
                setting=name,
                status=str(properties.get("status") or "unknown"),
                details=str(properties.get("details") or ""),
            )
        )
    return sorted(found, key=lambda reference: reference.setting)


def unresolved(references: Sequence[Reference]) -> list[Reference]:
    return [reference for reference in references if reference.status != RESOLVED]


def run_az(arguments: Sequence[str]) -> str:
    done = subprocess.run(  # noqa: S603 - the Azure CLI with arguments of this script's own
        ["az", *arguments],  # noqa: S607 - the Azure CLI from PATH, as the docs run it
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise AnswerError(f"az {' '.join(arguments[:2])} failed: {done.stderr.strip()[:500]}")
    return done.stdout


def site_url(subscription: str, resource_group: str, name: str) -> str:
    return (
        f"https://management.azure.com/subscriptions/{subscription}/resourceGroups/{resource_group}"
        f"/providers/Microsoft.Web/sites/{name}/config/configreferences/appsettings?api-version={API_VERSION}"
    )


def read_references(run: Runner, url: str) -> list[Reference]:
    text = run(["rest", "--method", "get", "--url", url, "--output", "json"])
    try:
        answer = json.loads(text)
    except json.JSONDecodeError as error:
        raise AnswerError(f"not JSON: {text[:200]}") from error
    if not isinstance(answer, Mapping):
        raise AnswerError(f"not an object: {text[:200]}")
    return references_of(answer)


def report(references: Sequence[Reference]) -> None:
    for reference in references:
        details = f": {reference.details}" if reference.details else ""
        print(f"{reference.setting}: {reference.status}{details}")


def check(
    run: Runner,
    url: str,
    restart: Sequence[str] | None,
    attempts: int,
    wait: float,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """0 when every reference resolves, within `attempts` restarts when `restart` is given; 1 if not."""
    references = read_references(run, url)
    report(references)
    for attempt in range(1, attempts + 1):
        pending = unresolved(references)
        if not pending:
            return 0
        if restart is None:
            break
        print(f"{len(pending)} reference(s) unresolved: restarting the app ({attempt}/{attempts})")
        run(restart)
        sleep(wait)
        references = read_references(run, url)
        report(references)
    if unresolved(references):
        print(
            "Key Vault references unresolved: check the function identity's Key Vault Secrets User role on the "
            "secret and the site's keyVaultReferenceIdentity, then run this again with --restart",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None, run: Runner = run_az) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resource-group", required=True)
    parser.add_argument("--name", required=True, help="the function app")
    parser.add_argument("--subscription", help="default: the Azure CLI's current subscription")
    parser.add_argument("--restart", action="store_true", help="restart the app while a reference is unresolved")
    parser.add_argument("--attempts", type=int, default=5, help="restarts at most (default 5)")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds after a restart (default 60)")
    parser.add_argument("--from-file", type=Path, help="read a recorded answer instead of asking Azure")
    args = parser.parse_args(argv)
    try:
        if args.from_file:
            references = references_of(json.loads(args.from_file.read_text(encoding="utf-8")))
            report(references)
            return 1 if unresolved(references) else 0
        subscription = args.subscription or run(["account", "show", "--query", "id", "--output", "tsv"]).strip()
        url = site_url(subscription, args.resource_group, args.name)
        restart = None
        if args.restart:
            restart = ["functionapp", "restart", "--subscription", subscription]
            restart += ["--resource-group", args.resource_group, "--name", args.name]
        return check(run, url, restart, args.attempts, args.wait)
    except AnswerError as error:
        print(f"check_keyvault_references: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
