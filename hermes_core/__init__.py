"""hermes_core: the Hermes agent library. It does not import Prefect.

What ``flows/`` and ``tasks/`` use is re-exported here; modules with a leading
underscore are private.
"""

from hermes_core.agent import Agent, AgentConfig, AgentResult
from hermes_core.client import ModelClient, ModelOptions, Usage
from hermes_core.distributions import DISTRIBUTIONS, format_distributions, get_distribution, sample_toolsets
from hermes_core.environments import Environment, ExecResult, create_environment
from hermes_core.exceptions import (
    AgentStop,
    ConfigError,
    HermesError,
    ModelError,
    PromptTimeout,
    SandboxError,
    ToolError,
)
from hermes_core.runner import PromptJob, PromptOutcome, RunSpec, run_prompt, unavailable_tools
from hermes_core.settings import HermesSettings
from hermes_core.tools import ALL_POSSIBLE_TOOLS, REGISTRY, TOOLSETS

__all__ = [
    "ALL_POSSIBLE_TOOLS",
    "DISTRIBUTIONS",
    "REGISTRY",
    "TOOLSETS",
    "Agent",
    "AgentConfig",
    "AgentResult",
    "AgentStop",
    "ConfigError",
    "Environment",
    "ExecResult",
    "HermesError",
    "HermesSettings",
    "ModelClient",
    "ModelError",
    "ModelOptions",
    "PromptJob",
    "PromptOutcome",
    "PromptTimeout",
    "RunSpec",
    "SandboxError",
    "ToolError",
    "Usage",
    "create_environment",
    "format_distributions",
    "get_distribution",
    "run_prompt",
    "sample_toolsets",
    "unavailable_tools",
]
