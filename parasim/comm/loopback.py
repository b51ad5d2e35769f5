"""What listens where on one machine: sockets bound to loopback alone, the loopback interface, and the
environment a local launch gives its workers, so that nothing a one-machine run opens is reachable from
another machine, whatever the environment says."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from typing import Any


def loopback_store(world: int, timeout: float) -> tuple[Any, int]:
    """The run's key-value store (where ranks meet), served by this process on 127.0.0.1 only."""
    import torch.distributed as dist

    sock = listening("127.0.0.1", 0, world)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world + 1,
        True,
        master_listen_fd=sock.fileno(),
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    sock.detach()  # the store owns the descriptor now and closes it
    return store, port


def listening(addr: str, port: int, world: int) -> socket.socket:
    """A socket listening on `addr` alone, for a TCPStore to serve on: torch's TCPStore binds every
    interface unless handed a socket that is already listening."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(max(128, world))
    return sock


def unbracket(host: str) -> str:
    """[IPv6] as IPv6 (as a URL writes it); anything else as it is."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") and ":" in host else host


def ip_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`text` as an IP address written in full (127.0.0.1, ::1, ::ffff:127.0.0.1, [::1], fe80::1%eth0: an IPv6
    zone is read as Python 3.9+ reads it, apart from the address), or None ([127.0.0.1] is none)."""
    try:
        return ipaddress.ip_address(unbracket(text))
    except ValueError:
        return None


def is_loopback(address: str) -> bool:
    """Whether the IP address `address` (a bound socket's, or a Host header's without its port) is one of
    this machine's loopback addresses: 127.0.0.0/8, ::1, or 127.x written as IPv6 (::ffff:127.0.0.1). A
    private address (10.x, 192.168.x, fe80::) is not: other machines reach it. A name is not either."""
    ip = ip_of(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


def loopback_address(host: str) -> str | None:
    """The address to listen on when `host` names this machine's loopback only (127.0.0.1, ::1, localhost):
    then every rank is on this machine. None for any other host, or one that does not resolve."""
    try:
        found = [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return None
    if not found or not all(is_loopback(a) for a in found):
        return None
    return next((a for a in found if ":" not in a), found[0])


def loopback_interface() -> str:
    """The name of the loopback interface, for gloo (GLOO_SOCKET_IFNAME): lo on Linux, lo0 on macOS."""
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return "lo0" if "lo0" in names and "lo" not in names else "lo"


def local_env() -> dict[str, str]:
    """The environment of a local launch's workers: the launcher's, but with gloo kept to the loopback
    interface whatever GLOO_SOCKET_IFNAME says (exported for a multi-node run, it would put every gloo
    socket of this one-machine run on that interface, reachable from other machines), over its default
    transport (GLOO_DEVICE_TRANSPORT=UV or TCP_TLS, set for a cluster, would fail where this torch lacks
    it), and NCCL's bootstrap likewise (NCCL_SOCKET_IFNAME). The store and MASTER_ADDR are the launcher's own,
    on 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if k != "GLOO_DEVICE_TRANSPORT"}
    lo = loopback_interface()
    # NCCL's bootstrap listens on a socket too (on the first interface that is not loopback, by default):
    # on one machine its ranks meet over loopback, and the GPUs still talk over NVLink or PCIe
    return {**env, "GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
