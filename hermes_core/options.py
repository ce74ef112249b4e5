"""Field metadata of the configuration models: which settings define a sample and which are run options.

Each option of a run is declared once, as a pydantic field of the model that uses it
(:class:`~hermes_core.client.ModelOptions`, :class:`~hermes_core.agent.AgentConfig`, and the
run's own ``flows.config.BatchConfig``). The command line's flags and the flow's parameters are
generated from those fields; this metadata says what else a field is:

* :data:`DEFINING` - the setting defines a sample (README § Resume, retries, identity): it is part of each prompt's
  identity, and a run refuses to continue with another value;
* :data:`DEFINING_WHEN_SET` - the same, but only once it is given a value: unset (None, the
  provider's default) it is left out of the defining settings, so an option added this way keeps
  the identities of the prompts of runs made before it existed;
* :data:`INTERNAL` - the field is set by code, not by the user (no flag, no flow parameter).

Examples:
    >>> from pydantic import BaseModel, Field
    >>> class Demo(BaseModel):
    ...     turns: int = Field(default=3, json_schema_extra=DEFINING)
    >>> is_defining(Demo.model_fields["turns"])
    True
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic.fields import FieldInfo

DEFINING: dict[str, Any] = {"defining": True}
"""``json_schema_extra`` of a setting that defines a sample."""
DEFINING_WHEN_SET: dict[str, Any] = {"defining": "when_set"}
"""``json_schema_extra`` of a setting that defines a sample when it is not None."""
INTERNAL: dict[str, Any] = {"run_option": False}
"""``json_schema_extra`` of a field that is not a user-facing run option."""


def _split_commas(value: Any) -> Any:
    """``"a,b"`` or ``["a,b", "c"]`` -> ``["a", "b", "c"]``; empty -> None; anything else unchanged."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        items = [part.strip() for item in value for part in str(item).split(",")]
        return [item for item in items if item] or None
    return value


CommaList = Annotated[list[str], BeforeValidator(_split_commas)]
"""A list of names given as a JSON list or as one comma-separated string (``--providers_allowed=a,b``)."""


def _extra(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def is_defining(field: FieldInfo, value: Any = None) -> bool:
    """True when the field is marked :data:`DEFINING`, or :data:`DEFINING_WHEN_SET` and ``value`` is not None."""
    marker = _extra(field).get("defining")
    return marker is True or (marker == "when_set" and value is not None)


def is_run_option(field: FieldInfo) -> bool:
    """False when the field is marked :data:`INTERNAL`."""
    return _extra(field).get("run_option", True) is not False


__all__ = ["DEFINING", "INTERNAL", "CommaList", "is_defining", "is_run_option"]
