"""``scores.jsonl``: scores given to a run's existing rows after the run (``hermes-batch score``).

A batch file is never rewritten. Re-scoring appends one line per row to ``scores.jsonl``::

    {"prompt_id": str, "prompt_index": int, "scoring_key": str,
     "score": {<scorer>: {"value": float, "passed": bool, "explanation": str}},
     "usage": {...} | null, "timestamp": str}

Readers lay the newest lines over the rows: a scorer's newest result replaces the row's result of
the same scorer, the row's other scorers stay, and ``metadata.passed`` is computed again over them
all (:func:`apply_rescore`). The merge (so ``trajectories.jsonl``, ``rejected.jsonl`` and the
statistics), the viewer and the export all read rows through it. A torn last line (a killed
``score``) is ignored; ``scoring_key`` tells a later ``score`` which rows it already did.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hermes_core.runfolder.files import iter_raw_lines, loads_object
from hermes_core.runfolder.folder import RunFolder

log = logging.getLogger(__name__)

Rescores = dict[str, dict[str, Any]]
"""prompt_id -> ``{"score": {<scorer>: result}, "keys": {scoring_key, ...}}`` (the newest result per scorer)."""


def read_rescores(run_dir: Path) -> Rescores:
    """The scores ``scores.jsonl`` gives each prompt_id, newest per scorer; empty when the file is missing.

    Lines that are not a JSON object with a string ``prompt_id`` and an object ``score`` are
    skipped (a warning names the line, except for a torn last line).
    """
    path = RunFolder(run_dir).scores
    rescores: Rescores = {}
    if not path.exists():
        return rescores
    for _offset, raw, line_no, is_last in iter_raw_lines(path):
        line = loads_object(raw)
        if (
            line is None
            or not isinstance(line.get("prompt_id"), str)
            or not isinstance(line.get("score"), dict)
        ):
            if not is_last:
                log.warning("%s line %d is not a score line; skipped", path, line_no)
            continue
        entry = rescores.setdefault(line["prompt_id"], {"score": {}, "keys": set()})
        entry["score"].update(
            {name: result for name, result in line["score"].items() if isinstance(result, dict)}
        )
        if isinstance(line.get("scoring_key"), str):
            entry["keys"].add(line["scoring_key"])
    return rescores


def apply_rescore(row: dict[str, Any], rescores: Rescores) -> bool:
    """Lay ``rescores``' results for ``row`` over its ``metadata.score`` in place; True when it changed.

    ``metadata.passed`` becomes true when every scorer of the merged ``score`` passed. The keys go
    inside ``metadata`` (at its end when new), so the row's own key order is kept.
    """
    metadata = row.get("metadata")
    if not isinstance(metadata, dict):
        return False
    entry = rescores.get(metadata.get("prompt_id"))  # type: ignore[arg-type]
    if not entry or not entry["score"]:
        return False
    own = metadata.get("score") if isinstance(metadata.get("score"), dict) else {}
    merged = {**own, **entry["score"]}
    metadata["score"] = merged
    metadata["passed"] = all(
        isinstance(result, dict) and result.get("passed") is True for result in merged.values()
    )
    return True


__all__ = ["Rescores", "apply_rescore", "read_rescores"]
