"""What real-rank tests share: the listening sockets and the live processes of a run (read from /proc),
an interface of this machine other than loopback, and `every_op`, one of each call, that the gloo and NCCL
tests both run against the virtual ranks."""
from __future__ import annotations

import os
import socket
from typing import Any

import parasim

LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net writes them


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address in /proc/net hex, port) of every listening TCP socket that one of `pids` holds."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = f.read().splitlines()[1:]
        for line in rows:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state 0A: LISTEN
                addr, port = fields[1].split(":")
                out.append((addr, int(port, 16)))
    return out


def listening_alive(pids: list[int]) -> list[tuple[str, int]]:
    """`listening` for processes that may exit while they are read."""
    try:
        return listening(pids)
    except OSError:
        return []


def children() -> list[int]:
    """Live processes under this test process: ranks are forked by the launcher's fork server (a child of
    ours that stays, as does multiprocessing's resource tracker), so their children count, not they."""
    parent, cmdline = {}, {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline") as f:
                    cmdline[int(pid)] = f.read()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(pid)] = int(fields[1])
    out, todo = [], [os.getpid()]
    while todo:
        me = todo.pop()
        for pid, pp in parent.items():
            if pp == me:
                todo.append(pid)
                if "forkserver" not in cmdline.get(pid, "") and "resource_tracker" not in cmdline.get(pid, ""):
                    out.append(pid)
    return out


def interface() -> str:
    """An interface of this machine with an IPv4 address other than loopback's (what a multi-node recipe
    would export), or eth0 where there is none."""
    import fcntl
    import struct

    def address(name: str) -> str | None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                return None
        return socket.inet_ntoa(raw[20:24])
    names = [n for _, n in socket.if_nameindex() if (a := address(n)) is not None and not a.startswith("127.")]
    return names[0] if names else "eth0"


def every_op(ctx: Any) -> dict:
    """One of each call, with groups in a non-ascending order and float32 data (not integer-valued)."""
    comm = ctx.comm
    rev = ctx.new_group(list(range(ctx.world))[::-1], "rev")
    x = ctx.asarray([1, 2, 3, 4, 5, 6]) * (10 ** ctx.rank)
    out = {"ar": comm.all_reduce(x), "rs": comm.reduce_scatter(x, group=rev), "ag": comm.all_gather(x, group=rev),
           "ring": comm.all_reduce(x, algo="ring"), "max": comm.all_reduce(x, op="max"),
           "bc": comm.broadcast(x, src=1),
           "a2a": comm.all_to_all([ctx.asarray([ctx.rank] * (j + 1)) for j in range(ctx.world)], group=rev)}
    ctx.compute("matmul", flops=16)
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    (out["p2p"],) = comm.exchange([parasim.Send(x, nxt), parasim.Recv(prv, (6,), x.dtype)])
    y = ctx.rng.normal((5,), dtype="float32")
    out["avg"] = comm.all_reduce(y, op="avg")
    comm.barrier()
    return out

