"""The tool registry: every tool of every toolset, declared once.

Importing this package imports each tool module, which registers its tools in
:data:`REGISTRY`. Everything else is derived from it: :data:`ALL_POSSIBLE_TOOLS`
(the ``tool_stats`` schema), :data:`TOOLSETS` (toolset -> tool names) and the
tools offered to one prompt (:func:`offered_tools`).
"""

from __future__ import annotations

from hermes_core.exceptions import ConfigError
from hermes_core.settings import HermesSettings
from hermes_core.tools import browser, file, image_gen, moa, terminal, vision, web  # noqa: F401 - registration
from hermes_core.tools._registry import REGISTRY, ModelEndpoint, Tool, ToolContext, tool

ALL_POSSIBLE_TOOLS: tuple[str, ...] = tuple(sorted(REGISTRY))
"""Every registered tool name, sorted: the keys of ``tool_stats`` and ``tool_error_counts``."""

TOOLSETS: dict[str, tuple[str, ...]] = {}
for _tool in REGISTRY.values():
    TOOLSETS[_tool.toolset] = (*TOOLSETS.get(_tool.toolset, ()), _tool.name)
del _tool


def offered_tools(
    toolsets: list[str] | tuple[str, ...], settings: HermesSettings
) -> tuple[list[Tool], dict[str, str]]:
    """Tools of ``toolsets`` that can be offered under ``settings``.

    Returns:
        (tools in registry order, {tool name: reason} for the tools left out because
        their backend is not configured).

    Raises:
        ConfigError: a toolset name that does not exist (the message lists the toolsets).
    """
    tools: list[Tool] = []
    unavailable: dict[str, str] = {}
    for toolset in toolsets:
        if toolset not in TOOLSETS:
            raise ConfigError(f"unknown toolset {toolset!r}; choose from {', '.join(sorted(TOOLSETS))}")
        for name in TOOLSETS[toolset]:
            reason = REGISTRY[name].unavailable_reason(settings)
            if reason is None:
                tools.append(REGISTRY[name])
            else:
                unavailable[name] = reason
    return tools, unavailable


__all__ = [
    "ALL_POSSIBLE_TOOLS",
    "REGISTRY",
    "TOOLSETS",
    "ModelEndpoint",
    "Tool",
    "ToolContext",
    "offered_tools",
    "tool",
]
