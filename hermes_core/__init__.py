"""hermes_core: the Hermes agent library. It does not import Prefect.

The names most callers need are re-exported here; every public module lists its own in
``__all__``, and modules or names with a leading underscore are private to their package
(docs/architecture.md, "hermes_core's public API"). Names are imported on first use (PEP 562),
so ``import hermes_core`` (or any of its light modules, e.g. ``hermes_core.exceptions``) loads
no model client, web framework, browser driver or tool backend.
"""

import importlib
from typing import Any

_PUBLIC: dict[str, str] = {
    "ALL_POSSIBLE_TOOLS": "hermes_core.tools",
    "Agent": "hermes_core.agent",
    "AgentConfig": "hermes_core.agent",
    "AgentResult": "hermes_core.agent",
    "AgentStop": "hermes_core.exceptions",
    "ConfigError": "hermes_core.exceptions",
    "DISTRIBUTIONS": "hermes_core.distributions",
    "Environment": "hermes_core.environments",
    "ExecResult": "hermes_core.environments",
    "HermesError": "hermes_core.exceptions",
    "HermesSettings": "hermes_core.settings",
    "ModelClient": "hermes_core.client",
    "ModelError": "hermes_core.exceptions",
    "ModelOptions": "hermes_core.client",
    "PromptJob": "hermes_core.runner",
    "PromptOutcome": "hermes_core.runner",
    "PromptTimeout": "hermes_core.exceptions",
    "REGISTRY": "hermes_core.tools",
    "RunSpec": "hermes_core.runner",
    "SandboxError": "hermes_core.exceptions",
    "TOOLSETS": "hermes_core.tools",
    "ToolError": "hermes_core.exceptions",
    "Usage": "hermes_core.usage",
    "create_environment": "hermes_core.environments",
    "format_distributions": "hermes_core.distributions",
    "get_distribution": "hermes_core.distributions",
    "run_prompt": "hermes_core.runner",
    "sample_toolsets": "hermes_core.distributions",
    "unavailable_tools": "hermes_core.runner",
}
"""Public name -> the module that defines it."""


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = sorted(_PUBLIC)
