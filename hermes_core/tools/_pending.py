"""Availability of toolsets whose backends are not built into this version yet."""

from __future__ import annotations

from hermes_core.exceptions import ToolError
from hermes_core.settings import HermesSettings


def not_configured(toolset: str):
    """Availability check that always refuses: the toolset has no backend in this version.

    The tools stay in the registry (names and schemas) so that every row's
    ``tool_stats`` has the full schema; they are never offered to the model.
    """

    def check(settings: HermesSettings) -> str | None:
        return f"toolset {toolset!r} has no backend configured in this version"

    return check


def refuse(name: str) -> dict:
    """Handler body of a tool that is never offered; reached only if a caller bypasses availability."""
    raise ToolError(f"{name} is not available: its backend is not configured")
