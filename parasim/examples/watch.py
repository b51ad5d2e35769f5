"""One token watched through a training step: the rank that holds it says so in the data phase
(`note_holder`), and its stage (`WatchStage`, the step's wrapper of the stage's layers) marks a phase per
(micro-batch, layer) and notes, on the rank holding the token, where the MoE routed it. The notes carry
their facts as data (watch="holds" | "layer" | "route"), which examples/moe16_path.py reads back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..nn import Saved
from ..nn.layer import Stack, StackWeights
from ..engine.context import Context

Watch = tuple[str, int]  # (sequence, 0-based position)


def note_holder(ctx: Context, watch: Watch | None, replica: tuple, rows: list[int], words: tuple[str, ...]) -> None:
    """On the rank whose rows hold the watched token of a sequence of its DP replica: where it lies."""
    if watch is None or watch[0] not in replica or watch[1] not in rows:
        return
    c, word = ctx.coords, f"{words[watch[1]]!r} (t{watch[1] + 1} of {watch[0]})"
    ctx.note(
        f"holds {word}: DP replica {c.dp}, micro-batch {replica.index(watch[0]) + 1}; CP rank {c.cp}; SP share "
        + " ".join(f"t{p + 1}" for p in rows)
        + f"; pipeline stage {c.pp + 1}",
        watch="holds",
        token=word,
        positions=[p + 1 for p in rows],
        stage=c.pp + 1,
    )


class WatchStage(StackWeights):
    """A pipeline stage of layers that marks phases per (micro-batch, layer) and, on the rank holding the
    watched token, notes where the MoE routed it. `script(seq)`: the rows whose routes are fixed in advance
    for sequence `seq` ({row: (experts, gates)}; {} for the router's own choices)."""

    def __init__(
        self,
        ctx: Context,
        layers: list,
        first: int,
        watch: Watch | None,
        replica: tuple,
        positions: list[int],
        script: Callable[[str], dict],
    ) -> None:
        self.ctx, self.layers, self.first, self.watch, self.replica = ctx, layers, first, watch, replica
        self.script = script
        self.positions = positions  # the sequence positions this rank holds between matmuls
        self.stack = Stack(layers)
        self.f_calls = self.b_calls = 0

    def _mine(self, mb: int) -> int | None:
        """The watched token's row in this rank's slice of micro-batch mb, or None."""
        if self.watch is None or self.replica[mb] != self.watch[0]:
            return None
        pos = self.positions
        return pos.index(self.watch[1]) if self.watch[1] in pos else None

    def forward(self, x: Any) -> tuple[Any, Any]:
        mb, self.f_calls = self.f_calls, self.f_calls + 1
        caches = []
        for i, layer in enumerate(self.layers):
            self.ctx.phase(
                f"forward mb{mb + 1} layer {self.first + i + 1}",
                direction="forward",
                micro_batch=mb + 1,
                layer=self.first + i + 1,
            )
            if layer.shape.experts:
                layer.mlp.scripted = self.script(self.replica[mb])
            x, c = layer.forward(x, Saved(tag=self.replica[mb]))  # the layers mark their outputs
            caches.append(c)
            row = self._mine(mb)
            if row is not None and not layer.shape.experts:
                self.ctx.note(
                    f"layer {self.first + i + 1}: attention and the MLP work on it here",
                    watch="layer",
                    layer=self.first + i + 1,
                )
            elif row is not None:
                self._note_route(layer, self.first + i + 1, row)
        return x, caches

    def _note_route(self, layer: Any, number: int, row: int) -> None:
        """Where the MoE of layer `number` sent the watched token (this rank's row `row`), and why."""
        me = self.ctx.rank
        picks = [(e, g, self._owner(layer, e)) for e, g in layer.mlp.last_routing[row]]
        routes = ", ".join(f"E{e + 1} (gate {g:.2f}) " + self._where(r) for e, g, r in picks)
        away = sorted({r for _, _, r in picks if r != me})
        trip = (
            (
                f"dispatch sends it to {', '.join(f'g{r}' for r in away)} (once per GPU) and combine brings "
                "the gate-weighted outputs back"
            )
            if away
            else "both experts are here: it stays put"
        )
        policy = layer.mlp.par.options.routing  # a routing policy (nn/routing.py) picks in place of the router
        who = (
            "the post's routing (scripted) picks"
            if row in layer.mlp.scripted
            else f"the {policy} policy picks"
            if policy is not None
            else "the router picks"
        )
        self.ctx.note(
            f"layer {number}: {who} {routes}; {trip}",
            watch="route",
            layer=number,
            experts=[e + 1 for e, _, _ in picks],
            gpus=[r for _, _, r in picks],
            gates=[round(float(g), 4) for _, g, _ in picks],
        )

    def _where(self, owner: int) -> str:
        """Where an expert whose EP rank is `owner` lives: on one GPU, or split over its expert-TP group."""
        shards = self._shards(owner)
        if len(shards) == 1:
            return "on this GPU" if owner == self.ctx.rank else f"on g{owner}"
        return "split over " + " and ".join("this GPU" if r == self.ctx.rank else f"g{r}" for r in shards)

    def _shards(self, owner: int) -> list[int]:
        """The GPUs an expert owned by `owner` is split over (its expert-TP group; itself at ETP 1)."""
        layout = self.ctx.layout
        if layout is None or layout.etp == 1:
            return [owner]
        return next(list(g) for g in layout.groups()["expert-tp"] if owner in g)

    def _owner(self, layer: Any, e: int) -> int:
        return self.ctx.groups["ep"].ranks[layer.mlp.owner(e)]

    def backward(self, caches: Any, dy: Any) -> Any:
        mb, self.b_calls = self.b_calls, self.b_calls + 1
        for i in reversed(range(len(self.layers))):
            self.ctx.phase(
                f"backward mb{mb + 1} layer {self.first + i + 1}",
                direction="backward",
                micro_batch=mb + 1,
                layer=self.first + i + 1,
            )
            dy = self.layers[i].backward(caches[i], dy)
        return dy
