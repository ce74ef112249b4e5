"""Toolset distributions: which toolsets a prompt gets, sampled per prompt.

Each distribution gives every toolset an independent probability (percent). A
prompt's toolsets are drawn as independent Bernoulli trials; when none is
chosen, the highest-percentage toolset is taken (the reference batch runner's
rule, README § Tools). The draw is seeded from (run seed, record key), so a
retried prompt gets the same tools.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from hermes_core.exceptions import ConfigError


@dataclass(frozen=True)
class Distribution:
    """A named toolset distribution: ``{toolset: percent}`` with a description."""

    name: str
    description: str
    toolsets: dict[str, int]


def _d(name: str, description: str, **toolsets: int) -> Distribution:
    return Distribution(name, description, toolsets)


_ALL7 = ("web", "vision", "image_gen", "terminal", "file", "moa", "browser")

DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in (
        _d("default", "All toolsets, all the time", **dict.fromkeys(_ALL7, 100)),
        _d("image_gen", "Image generation and vision work", image_gen=90, vision=90, web=55, terminal=45, moa=10),
        _d("research", "Web research with browsing and analysis", web=90, browser=70, vision=50, moa=40, terminal=10),
        _d(
            "science",
            "Scientific computing and research",
            web=94, terminal=94, file=94, vision=65, browser=50, image_gen=15, moa=10,
        ),
        _d("development", "Software development", terminal=80, file=80, moa=60, web=30, vision=10),
        _d("safe", "No terminal or file access", web=80, browser=70, vision=60, image_gen=60, moa=50),
        _d("balanced", "Every toolset at even odds", **dict.fromkeys(_ALL7, 50)),
        _d("minimal", "Web search only", web=100),
        _d("terminal_only", "Terminal and files only", terminal=100, file=100),
        _d("terminal_web", "Terminal, files and web", terminal=100, file=100, web=100),
        _d("creative", "Image generation and visual work", image_gen=90, vision=90, web=30),
        _d("reasoning", "Mixture of agents for hard reasoning", moa=90, web=30, terminal=20),
        _d("browser_use", "Browser automation with web and vision", browser=100, web=80, vision=70),
        _d("browser_only", "Browser only", browser=100),
        _d("browser_tasks", "Browser tasks with some vision and terminal", browser=97, vision=12, terminal=15),
        _d(
            "terminal_tasks",
            "Terminal-heavy tasks with web and browser",
            terminal=97, file=97, web=97, browser=75, vision=50, image_gen=10,
        ),
        _d(
            "mixed_tasks",
            "Browser, terminal and file tasks mixed",
            browser=92, terminal=92, file=92, web=35, vision=15, image_gen=15,
        ),
    )
}  # fmt: skip


def get_distribution(name: str) -> Distribution:
    """Look up a distribution by name.

    Raises:
        ConfigError: unknown name; the message lists the available ones.
    """
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise ConfigError(
            f"unknown distribution {name!r}; available: {', '.join(sorted(DISTRIBUTIONS))}"
        ) from None


def sample_toolsets(distribution: str | Distribution, rng: random.Random) -> list[str]:
    """Draw the toolsets of one prompt: independent Bernoulli per toolset, highest-percent fallback.

    Returns:
        Chosen toolset names in the distribution's order (never empty).
    """
    dist = distribution if isinstance(distribution, Distribution) else get_distribution(distribution)
    chosen = [ts for ts, pct in dist.toolsets.items() if rng.random() * 100 < pct]
    if not chosen:
        chosen = [max(dist.toolsets.items(), key=lambda item: item[1])[0]]
    return chosen


def prompt_rng(seed: int | str, key: str) -> random.Random:
    """A random generator seeded from (run seed, record key): the same prompt gets the same draw."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def format_distributions() -> str:
    """The ``--list_distributions`` listing: name, description, ``toolset : NN% chance`` lines, sorted."""
    lines = ["Available toolset distributions:", ""]
    for name in sorted(DISTRIBUTIONS):
        dist = DISTRIBUTIONS[name]
        lines.append(f"{name}: {dist.description}")
        for toolset, pct in sorted(dist.toolsets.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"    {toolset:<10} : {pct:3d}% chance")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "DISTRIBUTIONS",
    "Distribution",
    "format_distributions",
    "get_distribution",
    "prompt_rng",
    "sample_toolsets",
]
