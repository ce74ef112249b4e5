"""Latency the bubblewrap sandbox adds to the local backend: per command, and once per prompt.

Runs ``execute("true")`` (and a small real command, ``ls -la /usr/bin | wc -l``) ``--n`` times
in a plain ``LocalEnvironment`` (``HERMES_LOCAL_ISOLATION=none``) and in a bubblewrap one
(``bwrap``), and times ``start()`` + ``close()`` of each. Prints medians and 90th percentiles
in milliseconds and the difference. Needs ``bwrap`` installed.

Usage:
    python bench/sandbox_overhead.py [--n 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hermes_core.environments.local import LocalEnvironment
from hermes_core.settings import HermesSettings

COMMANDS = {"true": "true", "ls | wc": "ls -la /usr/bin | wc -l"}


def quantiles_ms(samples: list[float]) -> tuple[float, float]:
    """(median, 90th percentile) of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(0.9 * (len(ordered) - 1))] * 1000


def measure(mode: str, n: int) -> dict[str, tuple[float, float]]:
    """Timings of one isolation mode: ``{"start+close": ..., "<command>": ...}``, each (median, p90) in ms."""
    settings = HermesSettings(local_isolation=mode)
    lifecycle = []
    for _ in range(max(n // 10, 5)):
        began = time.perf_counter()
        with LocalEnvironment(settings=settings) as env:
            assert env.isolated == (mode == "bwrap"), f"{mode}: bubblewrap isolation not as asked"
        lifecycle.append(time.perf_counter() - began)
    figures = {"start+close": quantiles_ms(lifecycle)}
    with LocalEnvironment(settings=settings) as env:
        for label, command in COMMANDS.items():
            env.execute(command)  # warm up
            samples = []
            for _ in range(n):
                began = time.perf_counter()
                result = env.execute(command)
                samples.append(time.perf_counter() - began)
                assert result.returncode == 0, result
            figures[label] = quantiles_ms(samples)
    return figures


def main() -> None:
    """Print the table (milliseconds): plain, bubblewrap and the difference per measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="commands per measurement")
    n = parser.parse_args().n
    plain, bwrap = measure("none", n), measure("bwrap", n)
    print(
        f"{'measurement':<14} {'plain p50':>10} {'bwrap p50':>10} {'added p50':>10} {'plain p90':>10} {'bwrap p90':>10}"
    )
    for label in plain:
        (p50, p90), (b50, b90) = plain[label], bwrap[label]
        print(f"{label:<14} {p50:>10.2f} {b50:>10.2f} {b50 - p50:>+10.2f} {p90:>10.2f} {b90:>10.2f}")


if __name__ == "__main__":
    main()
