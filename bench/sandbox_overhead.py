"""Cost of the bubblewrap sandbox in the local backend: latency per command and per prompt, and machine CPU per prompt.

Latency: runs ``execute("true")`` (and a small real command, ``ls -la /usr/bin | wc -l``)
``--n`` times in a plain ``LocalEnvironment`` (``HERMES_LOCAL_ISOLATION=none``) and in a
bubblewrap one with each agent (``HERMES_SANDBOX_AGENT=python`` and ``native``), and times
``start()`` + ``close()`` of each. Prints medians and 90th percentiles in milliseconds.

CPU: ``--rounds`` rounds of ``--cycles`` start + ``execute("true")`` + close, one after
another, for each of plain, bwrap + Python agent and bwrap + native agent (interleaved), with
the sandbox network ``none`` and ``outbound``, and ``outbound+socket``: the outbound network
with a command that opens a network socket (``: > /dev/udp/127.0.0.1/9``, a bash builtin), so
that the native agent's sandbox brings its network up (network on demand: with ``true``
alone it never does). Machine CPU: the busy time of ``/proc/stat``
(every CPU, user + nice + system + irq + softirq + steal: kernel work such as namespace
teardown in kernel threads included) read before the cycles and after a pause that lets the
kernel finish cleaning up, less the machine's background busy rate measured just before
(each round first waits, up to 20 s, for the rest of the machine to go quiet). Prints medians
(and ranges) per prompt in milliseconds, and the background subtracted (CPU ms per second).
``getrusage`` cannot replace ``/proc/stat`` here: the processes inside a sandbox are reaped
by its pid namespace's init, which bubblewrap's outer process does not wait for, so their CPU
never reaches this process's ``RUSAGE_CHILDREN``. Needs ``bwrap`` (and ``slirp4netns`` for ``outbound``; without it
the sandbox falls back to ``none``).

Usage:
    python bench/sandbox_overhead.py [--n 200] [--cycles 40] [--rounds 5] [--network none outbound outbound+socket] [--skip-latency]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hermes_core.environments import native_agent
from hermes_core.environments.local import LocalEnvironment
from hermes_core.settings import HermesSettings

COMMANDS = {"true": "true", "ls | wc": "ls -la /usr/bin | wc -l"}
NETWORK_COMMANDS = {"none": "true", "outbound": "true", "outbound+socket": ": > /dev/udp/127.0.0.1/9"}
"""CPU table: network -> the command of each prompt (``+socket``: one that opens a network socket)."""
CONFIGS = {"plain": ("none", None), "bwrap+python": ("bwrap", "python"), "bwrap+native": ("bwrap", "native")}
"""Label -> (HERMES_LOCAL_ISOLATION, HERMES_SANDBOX_AGENT)."""
CLEANUP_PAUSE = 2.0
"""Seconds after the last cycle before reading the busy time (the kernel frees namespaces late)."""
QUIET_WAIT = 20.0
"""Longest wait, seconds, for the rest of the machine to go quiet before a CPU round."""
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def quantiles_ms(samples: list[float]) -> tuple[float, float]:
    """(median, 90th percentile) of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(0.9 * (len(ordered) - 1))] * 1000


def use_agent(agent: str | None) -> None:
    """Make the next sandboxes use ``agent`` (``python`` / ``native``; None: leave the default)."""
    if agent:
        os.environ["HERMES_SANDBOX_AGENT"] = agent
        native_agent.clear_cache()


def settings_for(isolation: str, network: str = "outbound") -> HermesSettings:
    return HermesSettings(local_isolation=isolation, sandbox_network=network)


def measure(label: str, n: int) -> dict[str, tuple[float, float]]:
    """Timings of one configuration: ``{"start+close": ..., "<command>": ...}``, each (median, p90) in ms."""
    isolation, agent = CONFIGS[label]
    use_agent(agent)
    settings = settings_for(isolation)
    lifecycle = []
    for _ in range(max(n // 10, 5)):
        began = time.perf_counter()
        with LocalEnvironment(settings=settings) as env:
            assert env.isolated == (isolation == "bwrap"), f"{label}: bubblewrap isolation not as asked"
            env.execute("true")  # the sandbox starts at first use
        lifecycle.append(time.perf_counter() - began)
    figures = {"start+true+close": quantiles_ms(lifecycle)}
    with LocalEnvironment(settings=settings) as env:
        for name, command in COMMANDS.items():
            env.execute(command)  # warm up
            samples = []
            for _ in range(n):
                began = time.perf_counter()
                result = env.execute(command)
                samples.append(time.perf_counter() - began)
                assert result.returncode == 0, result
            figures[name] = quantiles_ms(samples)
    return figures


def busy_jiffies() -> int:
    """Busy time of the whole machine so far, in clock ticks (``/proc/stat``, line ``cpu``)."""
    with open("/proc/stat") as fh:
        fields = [int(value) for value in fh.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal  # guest time is already inside user


def background_rate(seconds: float) -> float:
    """Busy ticks per second of the machine over ``seconds`` of this process sleeping."""
    began, busy = time.perf_counter(), busy_jiffies()
    time.sleep(seconds)
    return (busy_jiffies() - busy) / (time.perf_counter() - began)


def wait_quiet(limit: float = QUIET_WAIT) -> None:
    """Wait (at most ``limit`` seconds) until the rest of the machine uses under 5% of one CPU."""
    deadline = time.monotonic() + limit
    while background_rate(0.5) * TICK_MS > 50 and time.monotonic() < deadline:
        pass


def cpu_round(label: str, network: str, cycles: int) -> tuple[float, float, float]:
    """One round of ``cycles`` start + the network's command + close: (machine CPU ms, wall ms) per prompt, background ms/s.

    The machine figure is net of the background busy rate measured just before.
    """
    isolation, agent = CONFIGS[label]
    use_agent(agent)
    settings, command = settings_for(isolation, network.split("+")[0]), NETWORK_COMMANDS[network]
    wait_quiet()
    background = background_rate(1.0)
    began, busy = time.perf_counter(), busy_jiffies()
    for _ in range(cycles):
        with LocalEnvironment(settings=settings) as env:
            assert env.execute(command).returncode == 0
    wall = time.perf_counter() - began
    time.sleep(CLEANUP_PAUSE)
    ticks = busy_jiffies() - busy - background * (time.perf_counter() - began)
    return ticks * TICK_MS / cycles, wall * 1000 / cycles, background * TICK_MS


def cpu_table(cycles: int, rounds: int, networks: list[str]) -> None:
    """Print the per-prompt CPU table: the configurations interleaved, median (and range) over ``rounds``."""
    print(
        f"\nPer prompt: start + command (true; outbound+socket: {NETWORK_COMMANDS['outbound+socket']}) + close, "
        f"{rounds} rounds of {cycles}, medians (range), ms"
    )
    print(f"{'network':<9} {'configuration':<13} {'machine CPU':>22} {'wall':>8} {'background ms/s':>16}")
    for network in networks:
        for label in CONFIGS:  # warm up: probes, the agent's build, caches
            use_agent(CONFIGS[label][1])
            with LocalEnvironment(settings=settings_for(CONFIGS[label][0], network.split("+")[0])) as env:
                env.execute(NETWORK_COMMANDS[network])
        results: dict[str, list[tuple[float, float, float]]] = {label: [] for label in CONFIGS}
        for _ in range(rounds):
            for label in CONFIGS:
                results[label].append(cpu_round(label, network, cycles))
        for label, samples in results.items():
            machine, wall, background = (sorted(column) for column in zip(*samples, strict=True))
            cpu = f"{statistics.median(machine):.2f} ({machine[0]:.1f} to {machine[-1]:.1f})"
            print(
                f"{network:<9} {label:<13} {cpu:>22} {statistics.median(wall):>8.2f} {statistics.median(background):>16.1f}"
            )


def latency_table(n: int) -> None:
    """Print medians and 90th percentiles (ms) of each configuration, network outbound."""
    figures = {label: measure(label, n) for label in CONFIGS}
    print("Latency, ms (network outbound)")
    print(f"{'measurement':<18}" + "".join(f" {label + ' p50':>18} {'p90':>7}" for label in CONFIGS))
    for name in figures["plain"]:
        cells = "".join(
            f" {figures[label][name][0]:>18.2f} {figures[label][name][1]:>7.2f}" for label in CONFIGS
        )
        print(f"{name:<18}{cells}")


def main() -> None:
    """Print the latency table and the CPU table (milliseconds)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="commands per latency measurement")
    parser.add_argument("--cycles", type=int, default=40, help="prompts (start+command+close) per CPU round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per configuration (interleaved)")
    parser.add_argument(
        "--network",
        nargs="+",
        default=list(NETWORK_COMMANDS),
        choices=list(NETWORK_COMMANDS),
        help="CPU table networks",
    )
    parser.add_argument("--skip-latency", action="store_true", help="only the CPU table")
    args = parser.parse_args()
    print(f"native agent: {native_agent.native_agent() or 'not available'}; {os.cpu_count()} CPUs\n")

    if not args.skip_latency:
        latency_table(args.n)
    cpu_table(args.cycles, args.rounds, args.network)


if __name__ == "__main__":
    main()
