"""Toolset distributions: the 17 of the reference, sampling frequencies, fallback rule, reproducibility."""

from __future__ import annotations

import math
import random

import pytest

from hermes_core.distributions import (
    DISTRIBUTIONS,
    format_distributions,
    get_distribution,
    prompt_rng,
    sample_toolsets,
)
from hermes_core.exceptions import ConfigError
from hermes_core.tools import TOOLSETS

EXPECTED = {
    "default": dict.fromkeys(["web", "vision", "image_gen", "terminal", "file", "moa", "browser"], 100),
    "image_gen": {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45, "moa": 10},
    "research": {"web": 90, "browser": 70, "vision": 50, "moa": 40, "terminal": 10},
    "science": {
        "web": 94,
        "terminal": 94,
        "file": 94,
        "vision": 65,
        "browser": 50,
        "image_gen": 15,
        "moa": 10,
    },
    "development": {"terminal": 80, "file": 80, "moa": 60, "web": 30, "vision": 10},
    "safe": {"web": 80, "browser": 70, "vision": 60, "image_gen": 60, "moa": 50},
    "balanced": dict.fromkeys(["web", "vision", "image_gen", "terminal", "file", "moa", "browser"], 50),
    "minimal": {"web": 100},
    "terminal_only": {"terminal": 100, "file": 100},
    "terminal_web": {"terminal": 100, "file": 100, "web": 100},
    "creative": {"image_gen": 90, "vision": 90, "web": 30},
    "reasoning": {"moa": 90, "web": 30, "terminal": 20},
    "browser_use": {"browser": 100, "web": 80, "vision": 70},
    "browser_only": {"browser": 100},
    "browser_tasks": {"browser": 97, "vision": 12, "terminal": 15},
    "terminal_tasks": {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    "mixed_tasks": {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
}


def test_the_seventeen_distributions_of_the_spec():
    assert {name: d.toolsets for name, d in DISTRIBUTIONS.items()} == EXPECTED
    for dist in DISTRIBUTIONS.values():
        assert set(dist.toolsets) <= set(TOOLSETS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sampling_frequencies_match_the_percentages(name):
    draws = 10_000
    rng = random.Random(1234)
    counts = dict.fromkeys(EXPECTED[name], 0)
    for _ in range(draws):
        chosen = sample_toolsets(name, rng)
        assert chosen and len(set(chosen)) == len(chosen)
        for toolset in chosen:
            counts[toolset] += 1
    probs = {t: p / 100 for t, p in EXPECTED[name].items()}
    p_none = math.prod(1 - p for p in probs.values())
    fallback = max(EXPECTED[name].items(), key=lambda kv: kv[1])[0]
    for toolset, p in probs.items():
        expected = p + (p_none if toolset == fallback else 0.0)
        # 4.5 standard deviations of a binomial proportion over 10,000 draws (<= 0.0225)
        tolerance = 4.5 * math.sqrt(max(expected * (1 - expected), 1e-4) / draws)
        assert abs(counts[toolset] / draws - expected) <= tolerance, (toolset, counts[toolset], expected)


def test_fallback_takes_the_highest_percentage_toolset():
    class NeverChosen(random.Random):
        def random(self) -> float:
            return 0.999999

    assert sample_toolsets("research", NeverChosen()) == ["web"]
    assert sample_toolsets("browser_tasks", NeverChosen()) == ["browser"]


def test_a_prompt_always_draws_the_same_toolsets():
    draws = [sample_toolsets("balanced", prompt_rng(7, "prompt-abc")) for _ in range(5)]
    assert all(d == draws[0] for d in draws)
    others = {tuple(sample_toolsets("balanced", prompt_rng(7, f"p{i}"))) for i in range(50)}
    assert len(others) > 5


def test_unknown_distribution_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown distribution 'nope'; available: balanced, browser_only"):
        get_distribution("nope")


def test_listing_is_sorted_with_percent_lines():
    text = format_distributions()
    names = [line.split(":")[0] for line in text.splitlines()[2:] if line and not line.startswith(" ")]
    assert names == sorted(EXPECTED)
    assert "    terminal   : 100% chance" in text
