"""Run a pipeline schedule for real: each PP rank holds a stage (a block of layers), activations go forward
and gradients backward by point-to-point transfers, weight gradients add up over the micro-batches.

A send is posted together with the rank's next receive in one batched exchange (as Megatron pairs
send-forward with receive-backward), so two neighbours that send to each other never wait on one another;
a send with no receive right after it goes out at once.
"""
from __future__ import annotations

from typing import Any, Callable

from ..comm.interface import Group, Recv, Send
from .schedules import Action


class Stage:
    """What a stage must do: forward(x) -> (y, cache) and backward(cache, dy) -> dx."""

    def forward(self, x: Any) -> tuple[Any, Any]: ...
    def backward(self, cache: Any, dy: Any) -> Any: ...


def needs_recv(a: Action, first: bool, last: bool) -> bool:
    return (a.kind == "F" and not first) or (a.kind in ("B", "I") and not last)


def run_stage(ctx: Any, group: Group, actions: list[Action], stage: Stage, shape: tuple[int, ...], dtype: Any,
              inputs: Callable[[int], Any], loss: Callable[[int, Any], tuple[Any, Any]]) -> Any:
    """Run this rank's actions; returns the sum of the micro-batch losses (on the last stage, else 0).

    inputs(mb): the first stage's input of micro-batch mb. loss(mb, y): the last stage's (loss, dL/dy)."""
    r, p = group.group_rank(ctx.rank), group.size
    first, last = r == 0, r == p - 1
    prev = None if first else group.ranks[r - 1]
    nxt = None if last else group.ranks[r + 1]
    caches: dict[int, Any] = {}
    grads_in: dict[int, Any] = {}
    pending: list[Send] = []
    total = 0.0

    def receive(peer: int, what: str) -> Any:
        nonlocal pending
        label = f"stage {r + 1}: " + ("send, and receive " if pending else "receive ") + what
        got = ctx.comm.exchange(pending + [Recv(peer, shape, dtype)], group=group, label=label)
        pending = []
        return got[0]

    for i, a in enumerate(actions):
        if a.kind == "F":
            x = inputs(a.mb) if first else receive(prev, f"activation {a.mb + 1}")
            y, caches[a.mb] = stage.forward(x)
            if last:
                value, grads_in[a.mb] = loss(a.mb, y)
                total = total + value
            else:
                pending.append(Send(y, nxt))
        elif a.kind in ("B", "I"):
            dy = grads_in.pop(a.mb) if last else receive(nxt, f"gradient {a.mb + 1}")
            dx = stage.backward(caches.pop(a.mb), dy)
            if not first:
                pending.append(Send(dx, prev))
        # W: the layers compute weight gradients together with the input gradient, so nothing is left to do
        following = actions[i + 1] if i + 1 < len(actions) else None
        if pending and (following is None or not needs_recv(following, first, last)):
            ctx.comm.exchange(pending, group=group, label=f"stage {r + 1}: send")
            pending = []
    return total
