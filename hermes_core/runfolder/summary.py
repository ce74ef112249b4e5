"""What a run folder says about itself, for people: settings without secrets, statistics, tool usage.

Read by the viewer's run page and the exported dataset card, from ``run.json`` and
``statistics.json`` (README § Outputs). Every string passes the process's secret redaction
(:func:`hermes_core.redaction.redactor`), and settings named like credentials are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_core.redaction import CREDENTIAL_NAME, redactor
from hermes_core.runfolder.folder import RunFolder

__all__ = ["RunSummary", "read_summary"]


@dataclass(frozen=True)
class RunSummary:
    """A run's description.

    Attributes:
        run_name: the run's name (run.json, else the folder name).
        settings: the defining settings (``model, distribution, max_turns, ...`` from run.json),
            without credential-named keys, redacted; ``ephemeral_system_prompt`` and
            ``prefill_messages`` only say whether they were set, never their text.
        dataset: ``{"path", "records", "fingerprint"}`` from run.json (``{}`` when unknown).
        invocations: the invocation history of run.json (started_at, finished_at, duration_s, ...).
        statistics: ``statistics.json`` (redacted), or None when the run has not written it yet.
    """

    run_name: str
    settings: dict[str, Any]
    dataset: dict[str, Any]
    invocations: list[dict[str, Any]]
    statistics: dict[str, Any] | None

    def tool_usage(self) -> list[dict[str, Any]]:
        """Tools called at least once: ``{"tool", "count", "success", "failure", "success_rate"}``,
        most calls first (ties by name); ``[]`` without statistics."""
        tools = (self.statistics or {}).get("tool_statistics") or {}
        used = [{"tool": name, **values} for name, values in tools.items() if values.get("count")]
        return sorted(used, key=lambda t: (-t["count"], t["tool"]))


def _public_settings(defining: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in defining.items():
        if CREDENTIAL_NAME.search(key):
            continue
        if key == "ephemeral_system_prompt":  # run.json keeps a digest (older ones: the text)
            value = "set (not stored in trajectories)" if value else None
        elif key == "prefill_messages":
            value = "set (not stored in trajectories)" if value else None
        settings[key] = value
    return settings


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def read_summary(run_dir: Path) -> RunSummary:
    """The :class:`RunSummary` of a run folder.

    Raises:
        ValueError: run.json or statistics.json exists but is not valid JSON (the message names it).
    """
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    info = _read_json(folder.run_json) or {}
    stats = _read_json(folder.statistics)
    scrub = redactor().redact_obj
    return RunSummary(
        run_name=str(info.get("run_name") or run_dir.name),
        settings=scrub(_public_settings(info.get("defining") or {})),
        dataset=scrub(info.get("dataset") or {}),
        invocations=scrub(info.get("invocations") or []),
        statistics=scrub(stats) if isinstance(stats, dict) else None,
    )
