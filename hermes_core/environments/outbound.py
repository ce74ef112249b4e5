"""Outbound-only network for one bubblewrap sandbox: its own network namespace behind slirp4netns.

"Network on" means the internet and nothing of this machine: the sandbox has a network
namespace of its own (bubblewrap ``--unshare-net``) whose only way out is a user-mode TCP/IP
stack, `slirp4netns <https://github.com/rootless-containers/slirp4netns>`_ (Debian
``slirp4netns``), started with ``--disable-host-loopback`` (the host's 127.0.0.0/8, and
10.0.2.2 that would otherwise stand for it, are refused), ``--enable-sandbox`` and
``--enable-seccomp`` (slirp4netns confines itself, so a flaw in its stack is not a way onto the
host). Inside the namespace the sandbox sees ``lo`` (its own, empty), ``tap0`` 10.0.2.100/24, a
default route via 10.0.2.2 and DNS at 10.0.2.3 (forwarded to the host's resolver).

slirp4netns reaches anything the host can, so the namespace also gets ``unreachable`` routes for
every address that is not the internet (:data:`BLOCKED_NETWORKS`: private ranges, carrier-grade
NAT, link-local and the 169.254.169.254 metadata service, multicast, reserved) and for each of the
host's own addresses (a server on 0.0.0.0 of the host is not reachable through its public
address either). Networks listed in ``HERMES_SANDBOX_ALLOW_NETWORKS`` get a route via the gateway
instead. The routes are written over netlink from this process (one thread joins each namespace
in turn, just to open the socket, and comes back: ~0.4 ms), or with ``nsenter ... ip`` when this
process is not root.

Start cost: one slirp4netns process per sandbox (per prompt, not per command), ~4-6 ms of
machine CPU (bench/results.md), paid only by a sandbox one of whose commands opens a network
socket (network on demand, :class:`~hermes_core.environments.bwrap.BwrapSandbox`). It exits when
its exit pipe closes: at :meth:`OutboundNetwork.close`, or when this process dies.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import threading

from hermes_core.environments.poll import readable, wait_process
from hermes_core.environments.programs import find_program
from hermes_core.exceptions import SandboxError

GATEWAY = "10.0.2.2"
"""The sandbox's default gateway (slirp4netns; the host's loopback is refused there)."""
DNS_SERVER = "10.0.2.3"
"""The sandbox's name server (slirp4netns forwards it to the host's resolver)."""

BLOCKED_NETWORKS = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
"""IPv4 networks a sandbox never reaches unless allowed: RFC 1918 private ranges, RFC 6598 shared
space, link-local (cloud metadata at 169.254.169.254), IETF protocol assignments, benchmarking,
multicast and reserved. (The sandbox has no IPv6 route at all.)"""

_START_TIMEOUT = 10.0
"""Longest wait for slirp4netns to configure the namespace, seconds."""

_CLONE_NEWNET = 0x40000000
_RTM_NEWROUTE, _NLMSG_ERROR = 24, 2
_NLM_F_REQUEST_ACK_CREATE_EXCL = 0x1 | 0x4 | 0x400 | 0x200
_RT_TABLE_MAIN, _RTPROT_STATIC = 254, 4
_RTN_UNICAST, _RTN_UNREACHABLE = 1, 7
_RTA_DST, _RTA_GATEWAY = 1, 5


def slirp4netns_path() -> str | None:
    """Path of ``slirp4netns``, or None when it is not installed."""
    return find_program("slirp4netns")


@functools.lru_cache(maxsize=1)
def host_addresses() -> tuple[str, ...]:
    """This machine's own IPv4 addresses outside :data:`BLOCKED_NETWORKS` and 127/8 (read once).

    From ``/proc/net/fib_trie`` (the kernel's ``LOCAL`` routes); empty when it cannot be read.
    """
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as fh:
            previous = ""
            for line in fh:
                text = line.strip()
                if text.startswith("/32 host LOCAL") and previous:
                    found.add(previous)
                if text.startswith(("|--", "+--")):
                    previous = text.split()[1]
    except OSError:
        return ()
    blocked = [ipaddress.ip_network(net) for net in BLOCKED_NETWORKS]
    loopback = ipaddress.ip_network("127.0.0.0/8")
    kept = []
    for text in sorted(found):
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if address not in loopback and not any(address in net for net in blocked):
            kept.append(text)
    return tuple(kept)


def sandbox_routes(allowed: tuple[str, ...] = ()) -> list[tuple[str, str | None]]:
    """The routes a sandbox's namespace gets: ``(network, gateway)``; gateway None = unreachable.

    Args:
        allowed: networks (CIDR) the sandbox may reach although :data:`BLOCKED_NETWORKS` holds them.
    """
    routes: list[tuple[str, str | None]] = [(net, None) for net in BLOCKED_NETWORKS]
    routes += [(f"{address}/32", None) for address in host_addresses()]
    routes += [(str(ipaddress.ip_network(net, strict=False)), GATEWAY) for net in allowed]
    return routes


def resolv_conf() -> str:
    """The sandbox's ``/etc/resolv.conf`` text: the host's options, name server 10.0.2.3."""
    kept = []
    try:
        with open("/etc/resolv.conf") as fh:
            kept = [line for line in fh if line.split()[:1] in (["search"], ["domain"], ["options"])]
    except OSError:
        pass
    return "".join(kept) + f"nameserver {DNS_SERVER}\n"


class OutboundNetwork:
    """slirp4netns on the network namespace of one sandbox, plus its routes (see the module docstring).

    Args:
        pid: a process inside the namespace (the sandbox's agent, its init).
        allowed: networks to let through (``HERMES_SANDBOX_ALLOW_NETWORKS``).
    """

    def __init__(self, pid: int, allowed: tuple[str, ...] = ()):
        self.pid = pid
        self.allowed = allowed
        self._proc: subprocess.Popen | None = None
        self._exit_w: int | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Attach slirp4netns and write the routes; returns once the namespace is configured.

        Raises:
            SandboxError: slirp4netns is missing, did not configure the namespace within 10 s,
                or the routes could not be written (the sandbox must then not run).
        """
        slirp = slirp4netns_path()
        if slirp is None:
            raise SandboxError("slirp4netns is not installed (apt-get install slirp4netns)")
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        argv = [slirp, "--configure", "--mtu=65520", "--disable-host-loopback"]
        argv += ["--enable-sandbox", "--enable-seccomp", f"--exit-fd={exit_r}", f"--ready-fd={ready_w}"]
        if os.geteuid() != 0:
            argv.append(f"--userns-path=/proc/{self.pid}/ns/user")
        try:
            with self._lock:
                self._exit_w = exit_w
                self._proc = subprocess.Popen(
                    [*argv, str(self.pid), "tap0"],
                    pass_fds=(ready_w, exit_r),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError as exc:
            os.close(ready_r)
            self.close()
            raise SandboxError(f"cannot run slirp4netns: {exc}") from exc
        finally:
            os.close(ready_w)
            os.close(exit_r)
        try:
            ok = readable(ready_r, _START_TIMEOUT) and os.read(ready_r, 1) == b"1"
        finally:
            os.close(ready_r)
        if not ok:
            reason = self._errors()
            self.close()
            raise SandboxError(f"slirp4netns did not configure the sandbox's network: {reason}")
        try:
            write_routes(self.pid, sandbox_routes(self.allowed))
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot write the sandbox's routes: {exc}") from exc

    def _errors(self) -> str:
        """Why slirp4netns did not get ready: the end of its error output, or that it did not answer."""
        proc = self._proc
        if proc is not None:
            try:  # its ready pipe closed as it exited: the exit status can come a moment later
                wait_process(proc, 1)
            except subprocess.TimeoutExpired:
                pass
        if proc is None or proc.poll() is None:
            return "no answer within the time allowed"
        return (proc.stderr.read() or b"").decode("utf-8", "replace").strip()[
            -300:
        ] or f"exit {proc.returncode}"

    def close(self) -> None:
        """Stop slirp4netns (close its exit pipe, SIGKILL after 2 s). Idempotent, never raises."""
        with self._lock:
            proc, exit_w, self._proc, self._exit_w = self._proc, self._exit_w, None, None
        if exit_w is not None:
            os.close(exit_w)
        if proc is not None:
            try:
                wait_process(proc, 2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()


def write_routes(pid: int, routes: list[tuple[str, str | None]]) -> None:
    """Add ``routes`` (``(network, gateway or None for unreachable)``) to the main table of ``pid``'s namespace.

    Raises:
        OSError: a route was refused, or the namespace cannot be joined.
    """
    if os.geteuid() != 0:
        _write_routes_with_ip(pid, routes)
        return
    messages = _route_messages(tuple(routes))
    sock = _netlink_socket_in(pid)
    with sock:
        sock.bind((0, 0))
        for message in messages:
            sock.send(message)
        for _ in messages:
            _expect_ack(sock)


def _netlink_socket_in(pid: int) -> socket.socket:
    """A NETLINK_ROUTE socket of ``pid``'s network namespace, opened by the one thread that joins namespaces.

    A socket stays in the namespace it was made in, so only the making needs the thread there.
    That thread does nothing else (no other code must ever run in a sandbox's namespace), and
    goes back to this process's namespace after each socket, so it keeps no sandbox's alive.
    One long-lived thread instead of one per sandbox: a thread start per prompt, and ~1,000
    threads at W = 1,024 for every ``pivot_root`` on the machine to walk (bench/results.md).

    Raises:
        OSError: the namespace cannot be joined, or the socket cannot be made.
    """
    return _namespace_thread().submit(_open_in_namespace, pid).result()


@functools.lru_cache(maxsize=1)
def _namespace_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The thread of :func:`_netlink_socket_in`, started at the first use (again in a forked child)."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="hermes-netns", initializer=_remember_own_namespace
    )


os.register_at_fork(after_in_child=_namespace_thread.cache_clear)
# this process's network namespace (a descriptor), opened by the namespace thread when it starts
_own_namespace: list[int] = []


def _remember_own_namespace() -> None:
    try:
        _own_namespace[:] = [os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)]
    except OSError:  # then _open_in_namespace refuses to leave it (an executor whose initializer raised is broken for good)
        _own_namespace.clear()


def _open_in_namespace(pid: int) -> socket.socket:
    """Run only on :func:`_namespace_thread`: join ``pid``'s network namespace, make the socket, come back.

    Raises:
        OSError: the namespace cannot be joined or left, or the socket cannot be made.
    """
    if not _own_namespace:
        raise OSError(2, "cannot open this process's network namespace (/proc/thread-self/ns/net)")
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
    finally:
        os.close(target)
    sock = None
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    finally:
        try:
            _setns(_own_namespace[0])
        except OSError:  # the sandbox's namespace would stay alive with this thread in it
            if sock is not None:
                sock.close()
            raise
    return sock


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns: " + os.strerror(ctypes.get_errno()))


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.lru_cache(maxsize=8)
def _route_messages(routes: tuple[tuple[str, str | None], ...]) -> tuple[bytes, ...]:
    """The netlink messages of ``routes``, built once: every sandbox of a run gets the same routes."""
    return tuple(_route_message(seq, network, gateway) for seq, (network, gateway) in enumerate(routes, 1))


def _route_message(seq: int, network: str, gateway: str | None) -> bytes:
    """One RTM_NEWROUTE netlink message (``rtnetlink(7)``)."""
    net = ipaddress.ip_network(network)
    attributes = struct.pack("=HH", 8, _RTA_DST) + net.network_address.packed
    if gateway:
        attributes += struct.pack("=HH", 8, _RTA_GATEWAY) + socket.inet_aton(gateway)
    kind = _RTN_UNICAST if gateway else _RTN_UNREACHABLE
    body = struct.pack(
        "=BBBBBBBBI", socket.AF_INET, net.prefixlen, 0, 0, _RT_TABLE_MAIN, _RTPROT_STATIC, 0, kind, 0
    )
    body += attributes
    return struct.pack("=IHHII", 16 + len(body), _RTM_NEWROUTE, _NLM_F_REQUEST_ACK_CREATE_EXCL, seq, 0) + body


def _expect_ack(sock: socket.socket) -> None:
    """Read one netlink acknowledgement; raise OSError when it reports an error."""
    data = sock.recv(65536)
    offset = 0
    while offset + 16 <= len(data):
        length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
        if kind == _NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, offset + 16)
            if error:
                raise OSError(-error, f"netlink: {os.strerror(-error)}")
            return
        offset += max((length + 3) & ~3, 16)
    raise OSError(5, "netlink: no acknowledgement")


def _write_routes_with_ip(pid: int, routes: list[tuple[str, str | None]]) -> None:
    """The same routes through ``nsenter --user --net ... ip -batch -`` (a process that is not root)."""
    nsenter, ip = shutil.which("nsenter"), shutil.which("ip") or "/usr/sbin/ip"
    if not nsenter or not os.path.exists(ip):
        raise OSError(2, "nsenter and ip (util-linux, iproute2) are needed to write the sandbox's routes")
    script = "".join(
        f"route add {network} via {gateway}\n" if gateway else f"route add unreachable {network}\n"
        for network, gateway in routes
    )
    done = subprocess.run(
        [nsenter, "-t", str(pid), "-U", "-n", "--preserve-credentials", ip, "-batch", "-"],
        input=script.encode(),
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise OSError(1, done.stderr.decode("utf-8", "replace").strip()[-300:] or "ip failed")


__all__ = [
    "BLOCKED_NETWORKS",
    "DNS_SERVER",
    "GATEWAY",
    "OutboundNetwork",
    "host_addresses",
    "resolv_conf",
    "sandbox_routes",
    "slirp4netns_path",
    "write_routes",
]
