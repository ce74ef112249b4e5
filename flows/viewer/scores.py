"""Scores as the viewer and the export see them: a row's own ``metadata.score`` with the newest
re-scores of ``scores.jsonl`` laid over it (:mod:`hermes_core.runfolder.rescores`).

The index keeps, per prompt_id, only where its ``scores.jsonl`` lines are (byte offsets), so a
page reads the few lines of the rows it shows (:func:`read_lines`, :func:`rescores_of`) and memory
does not grow with the explanations. :func:`scan` reads the file once for the index build and also
folds each prompt's newest ``{scorer: {value, passed}}`` (explanations dropped) to compute the list's
score column (:func:`outcome`).

Score outcome of a prompt (the list's ``score`` column, :data:`OUTCOMES`):

* ``passed`` / ``failed`` - its row's ``metadata.passed`` (after the re-scores);
* ``errored`` - no row and no tombstone, and its newest ``failures.jsonl`` line has ``kind: infra``
  (the infrastructure broke; such a sample never becomes a row);
* None - not scored (no scorer applied, not run yet, discarded, or failed by the model or provider).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from hermes_core.runfolder.files import iter_raw_lines, loads_object
from hermes_core.runfolder.rescores import Rescores, apply_rescore

__all__ = ["OUTCOMES", "OUTCOME_LABELS", "Scan", "outcome", "read_lines", "rescores_of", "scan"]

OUTCOMES = ("passed", "failed", "errored")
"""The score outcomes the list filters by, in the order the run page shows them."""

OUTCOME_LABELS = {"passed": "pass", "failed": "fail", "errored": "errored"}
"""The word the score column shows for each outcome."""


class Scan(NamedTuple):
    """What :func:`scan` found in ``scores.jsonl``.

    Attributes:
        lines: prompt_id -> ``[(offset, length)]`` of its valid lines, oldest first.
        newest: prompt_id -> ``{scorer: {"value", "passed"}}``, the newest result per scorer.
    """

    lines: dict[str, list[tuple[int, int]]]
    newest: dict[str, dict[str, dict[str, Any]]]


def _valid(line: dict[str, Any] | None) -> bool:
    """A score line as :func:`hermes_core.runfolder.rescores.read_rescores` accepts it."""
    return line is not None and isinstance(line.get("prompt_id"), str) and isinstance(line.get("score"), dict)


def _results(line: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: result for name, result in line["score"].items() if isinstance(result, dict)}


def scan(path: Path) -> Scan:
    """Read ``scores.jsonl`` once (nothing when it is missing); invalid and torn lines are skipped."""
    found = Scan({}, {})
    if not path.is_file():
        return found
    for offset, raw, _, _ in iter_raw_lines(path):
        line = loads_object(raw)
        if not _valid(line):
            continue
        pid = line["prompt_id"]
        found.lines.setdefault(pid, []).append((offset, len(raw)))
        found.newest.setdefault(pid, {}).update(
            {
                name: {"value": result.get("value"), "passed": result.get("passed")}
                for name, result in _results(line).items()
            }
        )
    return found


def read_lines(path: Path, offsets: list[int], lengths: list[int]) -> list[dict[str, Any]]:
    """The ``scores.jsonl`` lines at ``offsets`` (as :func:`scan` found them), oldest first."""
    lines = []
    with open(path, "rb") as fh:
        for offset, length in zip(offsets, lengths, strict=True):
            fh.seek(offset)
            line = loads_object(fh.read(length))
            if _valid(line):
                lines.append(line)
    return lines


def rescores_of(lines: list[dict[str, Any]]) -> Rescores:
    """The :data:`~hermes_core.runfolder.rescores.Rescores` of some score lines (newest last), as
    :func:`~hermes_core.runfolder.rescores.read_rescores` makes them from the whole file."""
    rescores: Rescores = {}
    for line in lines:
        entry = rescores.setdefault(line["prompt_id"], {"score": {}, "keys": set()})
        entry["score"].update(_results(line))
        if isinstance(line.get("scoring_key"), str):
            entry["keys"].add(line["scoring_key"])
    return rescores


def outcome(
    metadata: dict[str, Any] | None, newest: dict[str, dict[str, Any]] | None
) -> tuple[str | None, float | None]:
    """(``passed`` | ``failed`` | None, mean score value | None) of a row's ``metadata`` with the
    re-scores ``newest`` (:attr:`Scan.newest` of its prompt_id) laid over, by
    :func:`~hermes_core.runfolder.rescores.apply_rescore`'s rule."""
    if not isinstance(metadata, dict):
        return None, None
    own = metadata.get("score") if isinstance(metadata.get("score"), dict) else {}
    stub = {"metadata": {"prompt_id": "p", "score": own, "passed": metadata.get("passed")}}
    if newest:
        apply_rescore(stub, {"p": {"score": newest, "keys": set()}})
    passed = stub["metadata"]["passed"]
    values = [
        float(r["value"])
        for r in stub["metadata"]["score"].values()
        if isinstance(r, dict)
        and isinstance(r.get("value"), int | float)
        and not isinstance(r["value"], bool)
    ]
    mean = sum(values) / len(values) if values else None
    return ("passed" if passed else "failed") if isinstance(passed, bool) else None, mean
