"""One Parquet schema for a stream of JSON rows, and its Hugging Face ``datasets`` features.

Every shard of an export must have the same schema, so the schema is inferred over all rows
first: :func:`merge_dtypes` combines the polars dtypes inferred chunk by chunk (null gives way
to any type, struct fields are united, int and float make float). A value that has no fixed
Arrow type - an empty object in every row, or values of incompatible types - becomes
:data:`JSON`: stored as its JSON text (polars serialises the object when the schema says
string) and declared ``dtype: json`` in the card, which ``datasets`` decodes back to objects,
as its own JSON loader does for such fields.

:func:`features_yaml` gives the ``dataset_info.features`` list of the card.

Scores (:func:`type_scores`). A scored row's ``metadata.score`` is an object keyed by scorer name,
``{<scorer>: {"value", "passed", "explanation"}}``. It is stored as it is in the row: a **struct
with one field per scorer of the run** (the union over the rows; a row that a scorer did not score
has null there), each a struct ``{value: float64, passed: bool, explanation: string}`` (fields a
scorer adds are kept with their inferred type). A row keeps its shape, and a value is read as
``row["metadata"]["score"]["verify"]["passed"]``. (A list of ``{scorer, value, passed,
explanation}`` structs would survive scorer names that change from row to row, but it would change
the row's shape; a run's scorers are few and fixed by ``--scorer``.) ``value`` is always float64
(an integer value of a user's scorer included), ``metadata.passed`` bool and
``metadata.sample_index`` int64, whatever the rows' JSON inferred.

This is where an export of a scored run differs from ``load_dataset("json", trajectories.jsonl)``:
``datasets``' JSON loader (5.x) reads an object whose keys differ from row to row - ``metadata``
when some rows are scored and others not, ``score`` when rows have different scorers - as one
untyped ``Json`` feature; the export gives the same values typed, with null for a scorer that did
not score a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

__all__ = ["JSON", "SCORE_FIELDS", "features_yaml", "finalise", "force_json", "merge_dtypes", "type_scores"]

JSON = pl.Struct({"\0json": pl.Null})
"""Marker dtype while merging: a value kept as JSON text (see the module docstring)."""

_NUMERIC = (pl.Int64, pl.Float64)
_FEATURE_DTYPES = {
    pl.Int64: "int64",
    pl.Float64: "float64",
    pl.String: "string",
    pl.Boolean: "bool",
    pl.Null: "null",
}


def merge_dtypes(a: pl.DataType, b: pl.DataType) -> pl.DataType:
    """The dtype that holds values of both ``a`` and ``b`` (see the module docstring)."""
    if a == b:
        return a
    if a == JSON or b == JSON:
        return JSON
    if a == pl.Null:
        return b
    if b == pl.Null:
        return a
    if isinstance(a, pl.Struct) and isinstance(b, pl.Struct):
        fields = {f.name: f.dtype for f in a.fields}
        for f in b.fields:
            fields[f.name] = merge_dtypes(fields[f.name], f.dtype) if f.name in fields else f.dtype
        return pl.Struct(fields)
    if isinstance(a, pl.List) and isinstance(b, pl.List):
        return pl.List(merge_dtypes(a.inner, b.inner))
    if a in _NUMERIC and b in _NUMERIC:
        return pl.Float64
    return JSON


def force_json(schema: dict[str, pl.DataType], path: Sequence[str]) -> dict[str, pl.DataType]:
    """``schema`` with the value at ``path`` made :data:`JSON` (``"[]"`` steps into a list's items).

    A path that is not in the schema is ignored.
    """

    def walk(dtype: pl.DataType, rest: Sequence[str]) -> pl.DataType:
        if not rest:
            return JSON
        head, tail = rest[0], rest[1:]
        if head == "[]" and isinstance(dtype, pl.List):
            return pl.List(walk(dtype.inner, tail))
        if isinstance(dtype, pl.Struct):
            return pl.Struct(
                {f.name: walk(f.dtype, tail) if f.name == head else f.dtype for f in dtype.fields}
            )
        return dtype

    if not path or path[0] not in schema:
        return dict(schema)
    out = dict(schema)
    out[path[0]] = walk(schema[path[0]], path[1:])
    return out


SCORE_FIELDS = {"value": pl.Float64, "passed": pl.Boolean, "explanation": pl.String}
"""The fixed type of each field of a scorer's result."""


def _score_result(dtype: pl.DataType) -> pl.DataType:
    """A scorer's result struct with :data:`SCORE_FIELDS` typed (added when missing), other fields kept."""
    if not isinstance(dtype, pl.Struct):
        return pl.Struct(SCORE_FIELDS) if dtype == pl.Null else dtype
    fields = {f.name: f.dtype for f in dtype.fields}
    return pl.Struct({**SCORE_FIELDS, **{k: v for k, v in fields.items() if k not in SCORE_FIELDS}})


def type_scores(schema: dict[str, pl.DataType], parent: Sequence[str]) -> dict[str, pl.DataType]:
    """``schema`` with the score fields under ``parent`` typed (see the module docstring).

    Args:
        schema: the merged schema.
        parent: the path of the struct holding ``score``, ``passed`` and ``sample_index``:
            ``("metadata",)`` for ShareGPT rows, ``()`` for the top level (``messages`` rows).

    Returns:
        A new schema; fields that are absent stay absent, a ``score`` that is not a struct (JSON
        text) stays as it is.
    """

    def fix(fields: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
        out = dict(fields)
        if isinstance(out.get("score"), pl.Struct) and out["score"] != JSON:
            out["score"] = pl.Struct({f.name: _score_result(f.dtype) for f in out["score"].fields})
        if "passed" in out and out["passed"] != JSON:
            out["passed"] = pl.Boolean
        if "sample_index" in out and out["sample_index"] != JSON:
            out["sample_index"] = pl.Int64
        return out

    if not parent:
        return fix(schema)
    head = schema.get(parent[0])
    if not isinstance(head, pl.Struct) or head == JSON:
        return dict(schema)
    inner = type_scores({f.name: f.dtype for f in head.fields}, parent[1:])
    return {**schema, parent[0]: pl.Struct(inner)}


def _storage(dtype: pl.DataType) -> pl.DataType:
    if dtype == JSON or (isinstance(dtype, pl.Struct) and not dtype.fields):
        return pl.String
    if isinstance(dtype, pl.Struct):
        return pl.Struct({f.name: _storage(f.dtype) for f in dtype.fields})
    if isinstance(dtype, pl.List):
        return pl.List(_storage(dtype.inner))
    return dtype


def _is_json(dtype: pl.DataType) -> bool:
    return dtype == JSON or (isinstance(dtype, pl.Struct) and not dtype.fields)


def finalise(schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    """The polars schema to read and write the rows with: every :data:`JSON` value (and empty struct) as string."""
    return {name: _storage(dtype) for name, dtype in schema.items()}


def _feature(dtype: pl.DataType, overrides: dict[str, str], path: str) -> dict[str, Any]:
    """The ``datasets`` YAML of one dtype, without its name."""
    if path in overrides:
        return {"dtype": overrides[path]}
    if _is_json(dtype):
        return {"dtype": "json"}
    if isinstance(dtype, pl.Struct):
        return {
            "struct": [
                {"name": f.name, **_feature(f.dtype, overrides, f"{path}.{f.name}")} for f in dtype.fields
            ]
        }
    if isinstance(dtype, pl.List):
        inner = _feature(dtype.inner, overrides, f"{path}[]")
        return {"list": inner["struct"] if "struct" in inner else inner.get("dtype", inner)}
    name = _FEATURE_DTYPES.get(dtype.base_type())
    if name is None:
        raise ValueError(f"no datasets feature for polars dtype {dtype} at {path}")
    return {"dtype": name}


def features_yaml(
    schema: dict[str, pl.DataType], overrides: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The card's ``dataset_info.features``: ``[{"name", "dtype" | "struct" | "list"}, ...]``.

    Args:
        schema: the merged schema (before :func:`finalise`, so JSON values are known).
        overrides: dotted path (``metadata.timestamp``; ``[]`` for list items) -> a ``datasets``
            dtype name declared instead of the inferred one (e.g. ``timestamp[s]``).

    Raises:
        ValueError: a dtype without a ``datasets`` equivalent.
    """
    overrides = overrides or {}
    return [{"name": name, **_feature(dtype, overrides, name)} for name, dtype in schema.items()]
