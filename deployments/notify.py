"""Set up the "run ended badly" notification: a notification block and the automation of automations.yaml.

Usage (``PREFECT_API_URL`` set)::

    python deployments/notify.py --webhook https://example.org/hook   # any webhook: POST {"subject", "body", "name"}
    python deployments/notify.py --slack https://hooks.slack.com/services/...
    python deployments/notify.py --block sendgrid-email/ops-mail      # a notification block saved before (UI, code)

It saves the block (``--webhook``: a ``CustomWebhookNotificationBlock``, ``--slack``: a
``SlackWebhook``, both named ``--block-name``, default ``hermes-batch-notify``, replaced when they
exist), puts its id into the automations of ``deployments/automations.yaml`` and creates them,
replacing automations of the same name. Exit 0, or 2 with one line on a bad argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import yaml

AUTOMATIONS_FILE = Path(__file__).resolve().parent / "automations.yaml"
BLOCK_PLACEHOLDER = "BLOCK_DOCUMENT_ID"


def save_block(*, webhook: str | None, slack: str | None, block: str | None, name: str) -> UUID:
    """The id of the notification block to use: saved from ``webhook`` / ``slack``, or ``block`` (``type-slug/name``) loaded.

    Raises:
        ValueError: none or several of the three given, or ``block`` is not ``type-slug/name``.
    """
    from prefect.blocks.core import Block
    from prefect.blocks.notifications import CustomWebhookNotificationBlock, SlackWebhook

    if sum(value is not None for value in (webhook, slack, block)) != 1:
        raise ValueError("give exactly one of --webhook URL, --slack URL, --block SLUG/NAME")
    if block is not None:
        if "/" not in block:
            raise ValueError(
                f"--block {block!r}: expected the block type's slug and the name, e.g. slack-webhook/ops"
            )
        return Block.load(block)._block_document_id
    if webhook is not None:
        made = CustomWebhookNotificationBlock(
            name="hermes-batch",
            url=webhook,
            method="POST",
            json_data={"subject": "{{subject}}", "body": "{{body}}", "name": "{{name}}"},
        )
    else:
        made = SlackWebhook(url=slack)
    return made.save(name, overwrite=True)


def automations(block_id: UUID, path: Path = AUTOMATIONS_FILE) -> list[dict[str, Any]]:
    """The automations of ``path`` with ``block_id`` in each notification action."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    found = data["automations"] if isinstance(data, dict) and "automations" in data else data
    for automation in found:
        for action in automation.get("actions", []):
            if action.get("block_document_id") == BLOCK_PLACEHOLDER:
                action["block_document_id"] = str(block_id)
    return found


def install(found: list[dict[str, Any]]) -> list[UUID]:
    """Create each automation, deleting first the automations of the same name; returns their ids."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    ids = []
    with get_client(sync_client=True) as client:
        for data in found:
            automation = AutomationCore.model_validate(data)
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            ids.append(client.create_automation(automation))
    return ids


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, save the block, create the automations; the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--webhook", metavar="URL", help="a webhook that receives a JSON POST {subject, body, name}"
    )
    parser.add_argument("--slack", metavar="URL", help="a Slack incoming-webhook URL")
    parser.add_argument(
        "--block", metavar="SLUG/NAME", help="a notification block saved before (e-mail, Teams ...)"
    )
    parser.add_argument(
        "--block-name", default="hermes-batch-notify", help="name of the block --webhook/--slack save"
    )
    parser.add_argument("--file", type=Path, default=AUTOMATIONS_FILE, help="the automations file")
    args = parser.parse_args(argv)
    try:
        block_id = save_block(webhook=args.webhook, slack=args.slack, block=args.block, name=args.block_name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = automations(block_id, args.file)
    for automation_id, data in zip(install(found), found, strict=True):
        print(f"automation {data['name']} ({automation_id}) notifies through block {block_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
