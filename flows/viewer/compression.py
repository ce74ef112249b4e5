"""What the viewer and the export read of a run's compression to a token budget (``hermes-batch compress``).

Files (:class:`hermes_core.runfolder.folder.RunFolder`): ``trajectories_compressed.jsonl`` (the
rows of ``trajectories.jsonl``, a middle region of turns replaced by one ``human`` turn starting
with ``[CONTEXT SUMMARY]:``) and ``compression_metrics.json`` (``{"totals", "settings", "rows"}``,
:mod:`hermes_core.compression.batch`). A compressed row is matched to its original by
``metadata.prompt_id``, which compression keeps (unique per sample of a record).

- :func:`scan_compressed`: ``prompt_id -> (offset, length)`` of each compressed row (no row kept).
- :func:`scan_metrics`: the run's :class:`CompressionSummary` and each row's figures
  (:data:`ROW_FIGURES`); the metrics JSON is read once, its per-row dicts are not kept.
- :func:`row_view`: what the trajectory page shows of one row's compression (figures, and the
  original and compressed turns paired side by side, the summary turn marked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.viewer.render import turn_views
from hermes_core.compression import STATUSES, SUMMARY_PREFIX
from hermes_core.runfolder.files import iter_raw_lines, loads_object

__all__ = [
    "ROW_FIGURES",
    "SHORT_LABELS",
    "STATUS_LABELS",
    "CompressionSummary",
    "scan_compressed",
    "scan_metrics",
    "read_summary",
    "row_view",
    "summary_text",
]

STATUS_LABELS = {
    "compressed": "compressed",
    "untouched": "untouched (at or under the budget)",
    "still_over": "still over the budget",
    "failed": "failed to summarise (kept uncompressed)",
    "dropped": "dropped (still over, --drop_over_limit)",
}
"""Human wording of each per-row status of the metrics (:data:`hermes_core.compression.STATUSES`)."""

SHORT_LABELS = {
    "compressed": "compressed",
    "untouched": "untouched",
    "still_over": "still over",
    "failed": "failed",
    "dropped": "dropped",
}
"""The same, short (the run page's cards, the card's table)."""

ROW_FIGURES = (
    "status",
    "tokens_before",
    "tokens_after",
    "turns_before",
    "turns_after",
    "region_first",
    "region_last",
    "error",
)
"""A row's figures as the index keeps them (``region_*``: the original turns replaced, 0-based)."""

CompressionSummary = dict[str, Any]
"""``{"totals": {...}, "settings": {...}}`` of ``compression_metrics.json`` (no ``rows``)."""


def scan_compressed(path: Path) -> dict[str, tuple[int, int]]:
    """``prompt_id -> (offset, length)`` of every row of a compressed file (first per prompt_id;
    a missing file gives ``{}``; a line that is not a row with a prompt_id is skipped)."""
    found: dict[str, tuple[int, int]] = {}
    if not Path(path).is_file():
        return found
    for offset, raw, _no, _last in iter_raw_lines(path):
        row = loads_object(raw)
        metadata = row.get("metadata") if row is not None else None
        pid = metadata.get("prompt_id") if isinstance(metadata, dict) else None
        if isinstance(pid, str):
            found.setdefault(pid, (offset, len(raw)))
    return found


def read_summary(path: Path) -> CompressionSummary | None:
    """The totals and settings of ``compression_metrics.json``, or None when it is missing or unreadable."""
    return scan_metrics(path)[0]


def scan_metrics(path: Path) -> tuple[CompressionSummary | None, dict[str, tuple[Any, ...]]]:
    """``({"totals", "settings"}, prompt_id -> figures)`` of ``compression_metrics.json``; figures are
    the values of :data:`ROW_FIGURES` in that order. ``(None, {})`` when the file is missing or not
    the metrics JSON."""
    try:
        metrics = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, {}
    if not isinstance(metrics, dict) or not isinstance(metrics.get("totals"), dict):
        return None, {}
    rows: dict[str, tuple[Any, ...]] = {}
    for row in metrics.get("rows") or ():
        if not isinstance(row, dict) or not isinstance(row.get("prompt_id"), str):
            continue
        region = row.get("region") if isinstance(row.get("region"), dict) else {}
        error = row.get("error")
        rows.setdefault(
            row["prompt_id"],
            (
                str(row.get("status")),
                _int(row.get("tokens_before")),
                _int(row.get("tokens_after")),
                _int(row.get("turns_before")),
                _int(row.get("turns_after")),
                _int(region.get("first")),
                _int(region.get("last")),
                str(error)[:2000] if error else None,
            ),
        )
    settings = metrics.get("settings") if isinstance(metrics.get("settings"), dict) else {}
    return {"totals": metrics["totals"], "settings": settings}, rows


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def summary_text(summary: CompressionSummary) -> dict[str, Any]:
    """The run-wide figures a page or a card shows: ``{"counts": [(status, label, n)], "tokens_before",
    "tokens_after", "tokens_saved", "ratio", "rows", "not_sampled", "target", "tokenizer",
    "summary_model", "protect_last_n_turns", "summary_target_tokens", "notice", "sample_percent",
    "over_budget"}`` (``over_budget``: rows written that are over the budget: still over and failed)."""
    totals, settings = summary.get("totals") or {}, summary.get("settings") or {}
    return {
        "counts": [(status, SHORT_LABELS[status], totals.get(status, 0)) for status in STATUSES],
        "tokens_before": totals.get("tokens_before"),
        "tokens_after": totals.get("tokens_after"),
        "tokens_saved": totals.get("tokens_saved"),
        "ratio": totals.get("overall_ratio"),
        "rows": totals.get("rows"),
        "rows_written": totals.get("rows_written"),
        "not_sampled": totals.get("not_sampled") or 0,
        "target": settings.get("target_max_tokens"),
        "tokenizer": settings.get("tokenizer"),
        "summary_model": settings.get("summary_model"),
        "protect_last_n_turns": settings.get("protect_last_n_turns"),
        "summary_target_tokens": settings.get("summary_target_tokens"),
        "notice": settings.get("summary_notice"),
        "sample_percent": settings.get("sample_percent"),
        "over_budget": (totals.get("still_over") or 0) + (totals.get("failed") or 0),
    }


def _is_summary(turn: Mapping[str, Any]) -> bool:
    return turn.get("from") == "human" and str(turn.get("value") or "").startswith(SUMMARY_PREFIX)


def row_view(
    figures: Mapping[str, Any] | None,
    original: Mapping[str, Any] | None,
    compressed: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """What the trajectory page shows of one row's compression, or None when the run has none for it.

    Args:
        figures: the row's values of :data:`ROW_FIGURES` (None: no metrics line for it).
        original: the row as generated (its turns are the left column).
        compressed: the row of ``trajectories_compressed.jsonl`` (None: not in the file).

    Returns:
        ``{"status", "label", "tokens_before", "tokens_after", "tokens_saved", "ratio",
        "turns_before", "turns_after", "region" ("turns 4-13 summarised" or None), "error",
        "in_file", "pairs", "compressed_turns"}``. ``pairs`` is ``[]`` unless the compressed turns
        differ from the original ones; then each pair is ``{"original": [turn views],
        "compressed": [turn views], "summary": bool, "same": bool}`` (``same``: the compressed turn is
        the original one unchanged): the turns before the replaced region one
        to one, the replaced region beside the summary turn, the turns after one to one (when
        the shapes do not line up: one pair of both whole columns). A compressed turn view has
        ``summary`` (the ``[CONTEXT SUMMARY]:`` turn) and ``changed`` (its text differs from the
        original turn beside it: the system turn with the notice).
    """
    if figures is None and compressed is None:
        return None
    figures = dict(figures or {})
    status = figures.get("status") or ("compressed" if compressed else None)
    first, last = figures.get("region_first"), figures.get("region_last")
    before, after = figures.get("tokens_before"), figures.get("tokens_after")
    view: dict[str, Any] = {
        "status": status,
        "label": STATUS_LABELS.get(status or "", status or "not in the metrics"),
        "tokens_before": before,
        "tokens_after": after,
        "tokens_saved": before - after if before is not None and after is not None else None,
        "ratio": round(after / before, 4) if before and after is not None else None,
        "turns_before": figures.get("turns_before"),
        "turns_after": figures.get("turns_after"),
        "region": None,
        "error": figures.get("error"),
        "in_file": compressed is not None,
        "pairs": [],
        "compressed_turns": 0,
    }
    if first is not None and last is not None:
        view["region"] = f"turns {first}-{last} summarised" if last > first else f"turn {first} summarised"
    if original is None or compressed is None:
        return view
    left = list(original.get("conversations") or [])
    right = list(compressed.get("conversations") or [])
    view["compressed_turns"] = len(right)
    if left == right:
        return view
    view["pairs"] = _pairs(left, right, first, last, view["region"])
    return view


def _pairs(
    left: Sequence[Mapping[str, Any]],
    right: Sequence[Mapping[str, Any]],
    first: int | None,
    last: int | None,
    region: str | None,
) -> list[dict[str, Any]]:
    """The original and compressed turns paired for two columns (see :func:`row_view`)."""
    originals, compressed = turn_views(left), turn_views(right)
    for view, turn in zip(compressed, right, strict=True):
        view["summary"] = _is_summary(turn)
        view["region"] = region if view["summary"] else None
        view["changed"] = False
    lines_up = (
        first is not None
        and last is not None
        and 0 <= first <= last < len(left)
        and len(right) == len(left) - (last - first)
        and compressed[first]["summary"]
    )
    if not lines_up:
        summary = any(v["summary"] for v in compressed)
        return [{"original": originals, "compressed": compressed, "summary": summary, "same": False}]
    shift = last - first
    pairs = []
    for i, view in enumerate(compressed):
        if i == first:
            pairs.append(
                {
                    "original": originals[first : last + 1],
                    "compressed": [view],
                    "summary": True,
                    "same": False,
                }
            )
            continue
        j = i if i < first else i + shift
        view["changed"] = view["raw"] != originals[j]["raw"]
        pairs.append(
            {"original": [originals[j]], "compressed": [view], "summary": False, "same": not view["changed"]}
        )
    return pairs
