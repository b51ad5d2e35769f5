"""A mixture-of-experts block with expert parallelism (EP), forward and backward side by side, in three parts
as torchtitan's MoE is (router, token dispatcher, experts), each one class below:

    Router:           every rank scores its own tokens against E experts (a small replicated matrix) and
                      keeps the top k (or a routing policy's k, or a scripted route); the gates are a softmax
                      over those k scores, so they sum to 1
    TokenDispatcher:  all-to-all over the EP group: each token goes once to every rank owning one of its
                      experts, carrying the gates of that rank's experts; and back (combine): one row per
                      (token, rank) returns home and the rows add up
    Experts:          each rank runs its experts, batched over the rows that chose them, and sums them
                      gate-weighted

Backward runs the same two all-to-alls in reverse: output gradients go out to the experts, and input
gradients (with the gates' gradients beside them) come back, then through the router's softmax. Experts are
placed in contiguous blocks: with E experts over an EP group of p, group rank i holds experts
i*E/p .. (i+1)*E/p - 1; each whole on its rank, or split over an expert-TP group (ETP). Under SP each TP rank
holds different tokens, so none is dispatched twice.

Only array operations of `ctx.xp` touch the data (one-hot choices, gathers, row blocks), so arrays that have
no values (shapes only) run the block unchanged; what needs values (an order of the router's scores, the
rows whose gates are nonzero) is refused by such arrays, and the block says what to do instead. Which token
goes where is worked out in numpy from the routing itself, which is always known.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from ..comm.interface import Array, Group
from ..errors import ParasimError, UsageError
from ..layout import LayoutError
from .activations import ACTIVATIONS
from .core import ParallelContext, Saved, Weights
from ..layout.placement import Partial, Placement, Replicate, Shard, local, settle
from .routing import GroupLimit, spellings

Accumulate = Callable[[str, Array], None]  # adds a weight's gradient to the block's, by the weight's name


class Routed(NamedTuple):
    """One forward's routing of the local tokens [n, h]: their experts, as chosen and one-hot, and the gates."""

    tokens: Array  # [n, h]: the router's input
    chosen: Any  # [n, k]: each token's experts, best first (lists, or a policy's read-only array)
    pick: Array  # [n, k, E]: choice j of token t is expert e
    gates: Array  # [n, k]
    fixed: Array  # [n, 1]: 1 for a scripted token, whose gates are constants
    per_expert: Array  # [n, E]: each expert's gate, 0 where the token did not choose it


class Router:
    """Which k experts each token goes to, and with what gates: the router's scores (tokens x its [h, E]
    matrix), a routing policy's draws when the parallel context has one, or a scripted route for some tokens.
    `limit`: DeepSeek-V3's node-limited routing, each token's k experts inside the few groups of experts it
    ranks best (nn/routing.py; None: any k experts), the router's and a routing policy's picks alike."""

    def __init__(
        self,
        par: ParallelContext,
        weight: Any,
        top_k: int,
        limit: GroupLimit | None,
        name: str,
        placements: dict[str, dict],
    ):
        """`placements`: the block's, where the router declares its own (as "router") and reads it back."""
        n_exp = weight.shape[1]
        if top_k is None or not 1 <= top_k <= n_exp:
            raise LayoutError(f"top_k must be between 1 and the number of experts ({n_exp}), got {top_k}")
        if limit is not None:
            limit.check(n_exp, top_k)
        self.par, self.k, self.limit, self.name = par, top_k, limit, name
        self.weight = par.xp.asarray(weight, copy=True)
        # the router is whole on every rank; under SP each TP rank routes its own tokens, so its gradient
        # is a partial sum over TP
        self.placements = placements
        placements["router"] = {"tp": Partial() if par.sp else Replicate()}
        self.calls = 0  # forward calls so far: with a routing policy, each names its draws
        self.last: tuple = ([], None)  # the last forward's picks and gates: `MoE.last_routing`
        # a scripted route for some local tokens (set before a forward): row -> (k experts, k gates). Their
        # gates are constants, so no gradient reaches the router through them (the post's drawn routing)
        self.scripted: dict[int, tuple[tuple[int, ...], tuple[float, ...]]] = {}

    @property
    def experts(self) -> int:
        return int(self.weight.shape[1])

    def forward(self, tokens: Array, saved: Saved, first: int) -> Routed:
        """Route the local tokens [n, h]; `first`: the index of the first of them among the EP group's, by which
        a routing policy draws."""
        xp = self.par.xp
        n, n_exp = tokens.shape[0], self.experts
        saved.keep(self.name, "router input", tokens)
        logits = xp.matmul(tokens, self.weight)
        chosen = self._choose(logits, n, first)  # per token: its k experts, best first
        pick = one_hot(xp, chosen, self.k, n_exp, tokens.dtype)  # [n, k, E]: choice j of token t is expert e
        gates = softmax(xp, xp.sum(logits[:, None, :] * pick, axis=2))  # [n, k]
        fixed = xp.zeros((n, 1), dtype=tokens.dtype)  # [n, 1]: 1 for a scripted token
        if self.scripted:
            fixed = xp.asarray([[1.0] if t in self.scripted else [0.0] for t in range(n)], dtype=tokens.dtype)
            given = xp.asarray(
                [list(self.scripted[t][1]) if t in self.scripted else [0.0] * self.k for t in range(n)],
                dtype=tokens.dtype,
            )
            gates = gates * (1.0 - fixed) + given * fixed
        per_expert = xp.sum(gates[:, :, None] * pick, axis=1)  # [n, E]: each expert's gate, 0 if not chosen
        self.last = (chosen, gates)
        return Routed(tokens, chosen, pick, gates, fixed, per_expert)

    def drawn(self, rank: int, first: int, n: int) -> np.ndarray:
        """[n, k]: the experts the routing policy drew, in the last forward, for rank `rank`'s n tokens counted
        from `first` (any rank's, without asking it: a policy draws from the token's identity)."""
        key = f"{self.name}#{self.calls - 1}"
        return self.par.options.routing.choose(key, rank, first, n, self.experts, self.k, self.limit)

    def _choose(self, logits: Array, n: int, first: int) -> list[list[int]]:
        """Each token's k experts, best first: scripted ones as given, the others by the routing policy when
        the parallel context has one, else by the router's scores (top k)."""
        policy, key = self.par.options.routing, f"{self.name}#{self.calls}"
        self.calls += 1
        if policy is None:
            top = self._top(logits)
            return [list(self.scripted[t][0]) if t in self.scripted else top[t] for t in range(n)]
        if self.scripted:
            raise UsageError(f"{self.name}: scripted routes and a routing policy do not mix")
        return policy.choose(key, self.par.ctx.rank, first, n, self.experts, self.k, self.limit)  # read-only

    def _top(self, logits: Array) -> list[list[int]]:
        """Each token's k best experts by the router's scores, best first; ties go to the lower index (a
        stable order of the negated scores). Under a group limit, the best among the groups it keeps."""
        try:
            order = self.par.xp.argsort(-logits, axis=1, stable=True)
        except ParasimError as exc:  # arrays without values have no order to give
            raise UsageError(
                f"{self.name}: no router scores to route by ({exc}); give a routing policy ({spellings()})"
            ) from None
        if self.limit is not None:  # the groups' scores are sums of the scores: from their values, in numpy
            scores = np.asarray(logits.tolist(), dtype=np.float64).reshape(-1, logits.shape[1])
            return self.limit.top(scores, self.k).tolist()
        return order[:, : self.k].tolist()

    def backward(self, routed: Routed, dper: Array, accumulate: Accumulate) -> Array:
        """From d loss / d (each expert's gate) [n, E]: the tokens' gradient through the router's scores, and
        (when the weights' gradients are taken) the router's own."""
        par, xp = self.par, self.par.xp
        dgates = xp.sum(dper[:, None, :] * routed.pick, axis=2)
        dsel = routed.gates * (dgates - xp.sum(routed.gates * dgates, axis=1, keepdims=True))  # the softmax
        dsel = dsel * (1.0 - routed.fixed)  # a scripted gate is a constant: nothing flows back to the router
        dlogits = xp.sum(dsel[:, :, None] * routed.pick, axis=1)

        def router_grad() -> None:
            g = xp.matmul(routed.tokens.T, dlogits)
            accumulate(
                "router", settle(par, self.placements["router"], g, f"{self.name} backward: sum router grad (SP)")
            )

        par.weight_grad(router_grad)
        return xp.matmul(dlogits, self.weight.T)


class TokenDispatcher:
    """The all-to-alls over the EP group: each token once to every EP rank holding one of its experts (with
    the gates of that rank's experts), and the experts' outputs home again; in backward the same two, the
    other way. Which rows go where is worked out in numpy from the routing, and kept while the routing is
    the very same (a policy's cached draws)."""

    def __init__(self, par: ParallelContext, ep: Group | None, n_exp: int, name: str):
        p = 1 if ep is None else ep.size
        if n_exp % p:
            raise LayoutError(f"{n_exp} experts do not split evenly over an EP group of {p}")
        self.par, self.ep, self.name = par, ep, name
        self.p, self.per = p, n_exp // p
        self.me = 0 if ep is None else ep.group_rank(par.ctx.rank)
        self._last_rows_to: tuple | None = None  # (picks, rows to each EP rank)
        self._last_received: tuple | None = None  # (senders' draws, arrived, sizes)
        self._last_plan: tuple | None = None  # (rows to each EP rank, their _Dispatch)

    def owner(self, expert: int) -> int:
        """The EP group rank that holds `expert`."""
        return expert // self.per

    def dispatch(self, routed: Routed) -> tuple[Array, _Dispatch, list[np.ndarray], list[int]]:
        """Rows out to the experts' ranks: the rows received (each a token and the gates of this rank's
        experts), the plan, the tokens sent to each EP rank, and how many rows came from each."""
        xp, tokens = self.par.xp, routed.tokens
        n = tokens.shape[0]
        # one row per (token, EP rank holding one of its experts), rank by rank: the token and the gates of
        # that rank's experts (per_expert's [n * p, per] view: row t * p + d is rank d's columns)
        rows = self.rows_to(routed.chosen)
        plan = self.plan(rows, n)
        sent = xp.concat(
            [
                _gather(xp, tokens, plan.tokens),
                _gather(xp, xp.reshape(routed.per_expert, (n * self.p, self.per)), plan.slots),
            ],
            axis=1,
        )
        got = self._a2a(
            split_rows(self._wire(sent, "dispatch"), plan.sizes),
            "dispatch: tokens (and their gates) to the ranks holding their experts",
        )
        sizes = [c.shape[0] for c in got]
        return self._wire(xp.concat(got, axis=0), "activations"), plan, rows, sizes

    def combine(self, out: Array, plan: _Dispatch, rows: list[np.ndarray], sizes: list[int], tokens: Array) -> Array:
        """The experts' outputs home: each rank's rows back to the tokens that sent them, added up, in the
        tokens' shape [n, h] and dtype."""
        xp = self.par.xp
        back = self._a2a(
            split_rows(self._wire(out, "combine"), sizes), "combine: expert outputs back to each token's rank"
        )
        self._check_back(back, rows)
        home = self._wire(xp.concat(back, axis=0), "activations")
        return add_at(xp, xp.zeros(tokens.shape, dtype=tokens.dtype), plan.tokens, home, plan.token_rounds)

    def combine_backward(self, dtok: Array, plan: _Dispatch) -> Array:
        """The output gradients [n, h] out to the experts' ranks, as the rows dispatch sent."""
        xp = self.par.xp
        outgoing = split_rows(self._wire(_gather(xp, dtok, plan.tokens), "dispatch"), plan.sizes)
        got = self._a2a(outgoing, "combine backward: output gradients out to the experts")
        return self._wire(xp.concat(got, axis=0), "activations")

    def dispatch_backward(self, back: Array, sizes: list[int]) -> Array:
        """The received rows' input and gate gradients home, in the order dispatch sent their rows."""
        xp = self.par.xp
        got = self._a2a(
            split_rows(self._wire(back, "combine"), sizes), "dispatch backward: input and gate gradients home"
        )
        return self._wire(xp.concat(got, axis=0), "activations")

    def rows_to(self, chosen: Any) -> list[np.ndarray]:
        """For each EP rank, the tokens that chose one of its experts (a token goes once per rank)."""
        if len(chosen) == 0:
            return [np.zeros(0, dtype=np.int64) for _ in range(self.p)]
        last = self._last_rows_to  # balanced routing: the policy's very same draws each call
        if last is not None and last[0] is chosen:
            return last[1]
        owners = np.asarray(chosen) // self.per  # [n, k]: the EP rank of each pick
        hit = np.zeros((len(owners), self.p), dtype=bool)  # [n, p]: token t picked an expert of rank d
        hit[np.arange(len(owners))[:, None], owners] = True
        rows = [np.flatnonzero(col) for col in hit.T]  # index arrays: 64 lists of 4,096 ints cost more
        if isinstance(chosen, np.ndarray) and not chosen.flags.writeable:  # a policy's cached draws
            self._last_rows_to = (chosen, rows)
        return rows

    def received(self, router: Router, sizes: list[int] | int, n: int, shift: int = 0) -> list[np.ndarray]:
        """With a routing policy, for each local expert the received rows that chose it, worked out from the
        senders' policy draws (every EP rank holds n tokens, as the layers split them): no value travels.
        `shift`: the rows an expert-TP peer `shift` ranks away received instead, from its own EP group (this
        one's, shifted: Megatron's expert mesh puts expert TP fastest); `sizes`: the rows from each sender, or
        (a peer's, whose senders' counts are not known here) their total."""
        srcs = [self.par.ctx.rank] if self.ep is None else self.ep.ranks
        draws = [router.drawn(src + shift, d * n, n) for d, src in enumerate(srcs)]
        last = self._last_received  # balanced routing: the very same draws every call
        if (
            last is not None
            and len(last[0]) == len(draws)
            and all(a is b for a, b in zip(last[0], draws))
            and last[2] == sizes
        ):
            return last[1]
        parts: list = []
        seen: dict[int, Any] = {}
        for d, theirs in enumerate(draws):
            mine = seen.get(id(theirs))  # balanced routing: every sender's draws are one array
            if mine is None:
                mine = seen[id(theirs)] = theirs[((theirs // self.per) == self.me).any(axis=1)]  # picks of mine
            if not isinstance(sizes, int) and len(mine) != sizes[d]:
                raise UsageError(
                    f"{self.name}: routing by policy needs the same number of tokens on every EP "
                    f"rank; EP rank {d} sent {sizes[d]} rows, its draws say {len(mine)}"
                )
            parts.append(mine)
        if isinstance(sizes, int) and sum(map(len, parts)) != sizes:
            raise UsageError(
                f"{self.name}: routing by policy needs the same number of tokens on every EP rank; an expert-TP "
                f"peer received {sizes} rows, its senders' draws say {sum(map(len, parts))}"
            )
        # each local expert's rows among the arrived rows (sender by sender, in order): worked out once for each
        # sender's draws that are alike (balanced routing: one array for all 64), then offset by where they land
        mine_experts = self.me * self.per + np.arange(self.per)
        found: dict[int, list[np.ndarray]] = {}
        cols: list[list[np.ndarray]] = [[] for _ in range(self.per)]
        offset = 0
        for part in parts:
            got = found.get(id(part))
            if got is None:
                picks = part.reshape(-1, router.k)  # [rows, k]: the experts each row chose
                got = found[id(part)] = [np.flatnonzero(c) for c in (picks[:, :, None] == mine_experts).any(axis=1).T]
            for e, at in enumerate(got):
                cols[e].append(at + offset)
            offset += len(part)
        rows = [np.concatenate(c) if c else np.zeros(0, dtype=np.intp) for c in cols]
        # the draws kept alive, so their ids stay theirs
        self._last_received = (draws, rows, sizes if isinstance(sizes, int) else list(sizes))
        return rows

    def plan(self, rows: list[np.ndarray], n: int) -> _Dispatch:
        """Where each dispatched row comes from and goes back to (the same rows give the very same plan)."""
        last = self._last_plan
        if last is not None and last[0] is rows:
            return last[1]
        xp, sizes = self.par.xp, [len(r) for r in rows]
        tokens = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        slots = tokens * self.p + np.repeat(np.arange(self.p), sizes)
        plan = _Dispatch(
            xp.asarray(tokens, dtype=xp.int64),
            xp.asarray(slots, dtype=xp.int64),
            sizes,
            _rounds(xp, tokens, n),
            _rounds(xp, slots, n * self.p),
        )
        self._last_plan = (rows, plan)
        return plan

    def _check_back(self, back: list, rows: list) -> None:
        """Each EP rank returns the rows it was sent. A folded run (a rank running once for several, whose
        chunks the others are given) holds that only when every EP rank receives as many rows: say so, rather
        than fail later on a shape."""
        for d, b in enumerate(back):
            if b.shape[0] != len(rows[d]):
                raise UsageError(
                    f"{self.name}: EP rank {d} returned {b.shape[0]} rows for the {len(rows[d])} sent "
                    "to it: a folded run needs every EP rank to receive as many rows (balanced "
                    "routing with a multiple of E tokens per GPU), or run the ranks unfolded"
                )

    def _wire(self, rows: Array, kind: str) -> Array:
        """`rows` in the dtype of `kind` when they cross the EP group (the run's precision: what goes toward the
        experts travels as the dispatch, what comes home as the combine, DeepSeek-V3's FP8 and BF16), back in
        the activations' dtype once they have arrived; as they are without an EP group to cross."""
        return rows if self.ep is None or self.p == 1 else self.par.ctx.cast(rows, kind)

    def _a2a(self, chunks: list, label: str) -> list:
        if self.ep is None or self.p == 1:
            return list(chunks)
        return self.par.comm.all_to_all(chunks, dim=0, group=self.ep, label=f"{self.name} {label}")


class Experts:
    """This rank's experts (`per` of them from global index `first`), each an MLP run on the received rows
    that chose it and summed gate-weighted. Over an expert-TP group (`etp`) each expert's w1 is split by
    columns (with b1) and w2 by rows, as Megatron's expert tensor parallelism does, and every rank of the
    group works on the rows any of them received."""

    def __init__(
        self,
        par: ParallelContext,
        experts: list[dict[str, Any]],
        first: int,
        per: int,
        etp: Group | None,
        act: str,
        name: str,
        placements: dict[str, dict],
    ):
        """`placements`: the block's, where each expert weight declares its own and reads it back."""
        self.par, self.first, self.per, self.act, self.name = par, first, per, act, name
        self.etp = etp if etp is not None and etp.size > 1 else None
        self.q = 1 if self.etp is None else self.etp.size
        self.eme = 0 if self.etp is None else self.etp.group_rank(par.ctx.rank)
        # b2 is added once (on ETP rank 0), so its gradient is partial over ETP
        over_etp: dict[str, Placement] = {"w1": Shard(1), "b1": Shard(0), "w2": Shard(0), "b2": Partial()}
        self.weights: list[dict[str, Any]] = []
        self.placements = placements
        for j in range(per):
            whole = {k: v for k, v in experts[first + j].items() if v is not None}
            self.weights.append({k: local(v, over_etp[k], self.q, self.eme, par.xp) for k, v in whole.items()})
            self.placements.update(
                {
                    f"expert{first + j + 1}.{k}": {"ep": Shard(0), "etp": over_etp[k]}
                    if self.q > 1
                    else {"ep": Shard(0)}
                    for k in whole
                }
            )
        self._last_rows: tuple | None = None  # (arrived, received rows, each local expert's rows and gathers)

    def forward(self, xs: Array, ws: Any, arrived: list[np.ndarray] | None, saved: Saved) -> tuple[Any, list]:
        """The gate-weighted sum of this rank's experts on the received rows xs, with their gates ws [rows, per];
        `arrived`: the rows that chose each local expert, when the routing policy says so without values."""
        xp = self.par.xp
        act = ACTIVATIONS[self.act][0]
        out = xp.zeros_like(xs)
        caches: list[tuple | None] = []
        for j, (e, (idx, rounds)) in enumerate(zip(self.weights, self._rows(ws, arrived))):
            if not len(idx):
                caches.append(None)
                continue
            xj = _take(xp, xs, idx)
            hj = xp.matmul(xj, e["w1"]) + e.get("b1", 0.0)
            saved.keep(f"{self.name}.expert{self.first + j + 1}", "activation input", hj)
            aj = act(xp, hj)
            saved.keep(f"{self.name}.expert{self.first + j + 1}", "fc2 input", aj)
            yj = xp.matmul(aj, e["w2"]) + (e.get("b2", 0.0) if self.eme == 0 else 0.0)  # b2 once over ETP
            gj = _take(xp, ws, idx)[:, j]
            out = add_at(xp, out, idx, gj[:, None] * yj, rounds)
            caches.append((idx, xj, hj, aj, yj, gj, rounds))
        return out, caches

    def backward(self, caches: list, dout: Array, xs: Array, ws: Array, accumulate: Accumulate) -> tuple[Any, Any]:
        """The received rows' input and gate gradients from their output gradients dout."""
        xp = self.par.xp
        dxs = xp.zeros_like(xs)
        dws = xp.zeros_like(ws)
        for j, c in enumerate(caches):
            if c is not None:
                dxj, dgj = self._expert_backward(j, c, dout, accumulate)
                dxs = add_at(xp, dxs, c[0], dxj, c[-1])
                dws = add_at(xp, dws, c[0], dgj[:, None] * _unit(xp, j, self.per, xs.dtype)[None, :], c[-1])
        return dxs, dws

    def _expert_backward(self, j: int, c: tuple, dout: Array, accumulate: Accumulate) -> tuple[Any, Any]:
        xp = self.par.xp
        idx, xj, hj, aj, yj, gj, _ = c
        e, key = self.weights[j], f"expert{self.first + j + 1}"
        do = _take(xp, dout, idx)
        dgj = xp.sum(do * yj, axis=1)
        dyj = gj[:, None] * do
        da = xp.matmul(dyj, e["w2"].T)
        dh = ACTIVATIONS[self.act][1](xp, hj, da)

        def weights() -> None:
            accumulate(f"{key}.w2", xp.matmul(aj.T, dyj))
            accumulate(f"{key}.w1", xp.matmul(xj.T, dh))
            if "b2" in e:
                db2 = xp.sum(dyj, axis=0) if self.eme == 0 else xp.zeros_like(e["b2"])
                label = f"{self.name} backward: sum {key}.b2 grad over expert-TP"
                accumulate(f"{key}.b2", settle(self.par, self.placements[f"{key}.b2"], db2, label))
            if "b1" in e:
                accumulate(f"{key}.b1", xp.sum(dh, axis=0))

        self.par.weight_grad(weights)
        return xp.matmul(dh, e["w1"].T), dgj

    def _rows(self, ws: Any, arrived: list[np.ndarray] | None) -> list[tuple[Any, list[np.ndarray]]]:
        """For each local expert, the received rows that chose it and `add_at`'s gathers onto them: from the
        policy's draws when routing by policy (the very same draws give the very same rows), else from the
        gates that came with the rows (zero for an expert a row did not choose)."""
        n_rows = ws.shape[0]
        last = self._last_rows
        if arrived is not None and last is not None and last[0] is arrived and last[1] == n_rows:
            return last[2]
        found = []
        for j in range(self.per):
            idx = arrived[j] if arrived is not None else self._gated(ws, j)
            found.append((idx, _rounds(self.par.xp, idx, n_rows)))
        if arrived is not None:
            self._last_rows = (arrived, n_rows, found)
        return found

    def _gated(self, ws: Any, j: int) -> list[int]:
        """The received rows whose gate for local expert j is nonzero."""
        try:
            return self.par.xp.nonzero(ws[:, j] != 0.0)[0].tolist()
        except ParasimError as exc:  # arrays without values have no gates to read
            raise UsageError(
                f"{self.name}: the rows that chose each expert are read from their gates ({exc}); "
                "arrays without values need a routing policy (uniform, balanced, skewed:F)"
            ) from None

    def gather(self, rows: Array, label: str) -> tuple[Any, list[int]]:
        """Every expert-TP rank's received rows, in group order, on every one of them (counts may differ,
        so an all-to-all that sends each peer the whole block, not an all-gather); and the counts."""
        if self.etp is None:
            return rows, [rows.shape[0]]
        got = self.par.comm.all_to_all([rows] * self.q, dim=0, group=self.etp, label=f"{self.name} {label}")
        return self.par.xp.concat(got, axis=0), [g.shape[0] for g in got]

    def sum(self, partial: Array, sizes: list[int], label: str) -> Array:
        """The reverse of `gather`: each rank's own rows, summed over the group's partial results (a
        reduce-scatter with uneven counts, as an all-to-all and a local sum)."""
        if self.etp is None:
            return partial
        got = self.par.comm.all_to_all(split_rows(partial, sizes), dim=0, group=self.etp, label=f"{self.name} {label}")
        total = got[0]
        for g in got[1:]:
            total = total + g
        return total


class MoE(Weights):
    """The block: a Router, a TokenDispatcher and this rank's Experts, in that order forward and the reverse
    backward; it holds their weights' gradients under the names `placements` gives (router,
    expert<n>.<w> with n counted from 1 over the whole layer)."""

    def __init__(
        self,
        par: ParallelContext,
        ep: Group | None,
        router: Any,
        experts: list[dict[str, Any]],
        top_k: int,
        act: str = "gelu",
        name: str = "moe",
        etp: Group | None = None,
        limit: GroupLimit | None = None,
    ):
        """`etp`: the expert-TP group, over which each expert's matrices are split; None: each expert whole on
        its EP rank. `limit`: node-limited routing (Router)."""
        self.par, self.name, self.act = par, name, act
        self.dispatcher = TokenDispatcher(par, ep, len(experts), name)
        self.placements: dict[str, dict] = {}  # each weight's, by name: the router and the experts write theirs
        self.gate = Router(par, router, top_k, limit, name, self.placements)
        # this rank's experts: `per` of them, the first of them expert `first` (counted from 0 over the layer)
        self.per = self.dispatcher.per
        self.first = self.dispatcher.me * self.per
        self.local_experts = Experts(par, experts, self.first, self.per, etp, act, name, self.placements)
        self._grads: dict[str, Any] = {}

    @property
    def experts(self) -> list[dict[str, Any]]:
        """This rank's experts' weights (each a dict: w1, w2 and the biases), expert `first` first."""
        return self.local_experts.weights

    @property
    def router(self) -> Any:
        """The router's [h, E] matrix."""
        return self.gate.weight

    @property
    def scripted(self) -> dict[int, tuple[tuple[int, ...], tuple[float, ...]]]:
        return self.gate.scripted

    @scripted.setter
    def scripted(self, routes: dict[int, tuple[tuple[int, ...], tuple[float, ...]]]) -> None:
        self.gate.scripted = routes

    def owner(self, expert: int) -> int:
        """The EP group rank that holds `expert`."""
        return self.dispatcher.owner(expert)

    def _locate(self, name: str) -> tuple[Any, str]:
        """'router', or 'expert<n>.<w>' (n counted from 1 over the whole layer): the dict of the local expert."""
        if name == "router":
            return self.gate, "weight"
        expert, key = name.split(".")
        return self.experts[int(expert[len("expert") :]) - 1 - self.first], key

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        xp = self.par.xp
        shape = x.shape
        h = shape[-1]
        tokens = xp.reshape(x, (-1, h))
        n = tokens.shape[0]
        routed = self.gate.forward(tokens, saved, self.dispatcher.me * n)
        recv, plan, rows, sizes = self.dispatcher.dispatch(routed)
        # ETP: every rank of the expert-TP group works on the rows any of them received
        recv, etp_sizes = self.local_experts.gather(recv, "dispatched tokens to every expert-TP rank")
        # with a routing policy, which of my experts each received row chose, from the senders' draws
        arrived = None if self.par.options.routing is None else self._arrived(sizes, n, etp_sizes)
        xs, ws = recv[:, :h], recv[:, h:]
        saved.keep(self.name, "dispatched tokens", xs)
        out, expert_caches = self.local_experts.forward(xs, ws, arrived, saved)
        out = self.local_experts.sum(out, etp_sizes, "sum the experts' partial outputs over expert-TP")
        y = self.dispatcher.combine(out, plan, rows, sizes, tokens)
        return xp.reshape(y, shape), (shape, routed, plan, sizes, etp_sizes, xs, ws, expert_caches)

    def _arrived(self, sizes: list[int], n: int, etp_sizes: list[int]) -> list[np.ndarray]:
        """For each local expert, the rows (after the expert-TP gather) that chose it, from the policy's draws:
        each expert-TP peer's received rows in group order, one block after another, as `gather` lays them."""
        etp, me = self.local_experts.etp, self.par.ctx.rank
        if etp is None:
            return self.dispatcher.received(self.gate, sizes, n)
        cols: list[list[np.ndarray]] = [[] for _ in range(self.per)]
        offset = 0
        for peer, count in zip(etp.ranks, etp_sizes):
            # a peer's count from each of its senders is not known here: its total is (the gather's)
            rows = self.dispatcher.received(self.gate, count, n, shift=peer - me)
            for j, r in enumerate(rows):
                cols[j].append(r + offset)
            offset += count
        return [np.concatenate(c) for c in cols]

    @property
    def last_routing(self) -> list[list[tuple[int, float]]]:
        """Per local token of the last forward: (expert, gate) for each pick, best first (gates NaN where the
        arrays have no values)."""
        chosen, gates = self.gate.last
        chosen = chosen.tolist() if isinstance(chosen, np.ndarray) else chosen  # plain ints, for notes and JSON
        shown = [] if gates is None else _rows(gates)
        return [list(zip(chosen[t], shown[t])) for t in range(len(chosen))]

    @property
    def last_picks(self) -> np.ndarray:
        """[n, k]: each local token's experts in the last forward, best first (`last_routing` without the
        gates, as one array: cheap for the thousands of tokens of a run at real size)."""
        return np.asarray(self.gate.last[0], dtype=np.int64).reshape(-1, self.gate.k)

    # -- backward ------------------------------------------------------------------------------------
    def backward(self, cache: tuple, dy: Array) -> Array:
        par, xp = self.par, self.par.xp
        tp = par.tp_group
        if (
            tp is not None
            and tp.size > 1
            and not par.sp
            and self.dispatcher.ep is not None
            and len(set(self.dispatcher.ep.ranks) & set(tp.ranks)) > 1
        ):
            # forward is right (each copy comes home), the expert gradients would not be: Megatron's rule
            raise LayoutError(
                f"an MoE layer whose EP group shares ranks with TP {par.tp_world_size} needs sequence "
                "parallelism for backward: without it those ranks route the same tokens and the "
                "experts' gradients count each token more than once"
            )
        shape, routed, plan, sizes, etp_sizes, xs, ws, expert_caches = cache
        h, n = shape[-1], routed.tokens.shape[0]
        dout = self.dispatcher.combine_backward(xp.reshape(dy, (-1, h)), plan)
        dout, _ = self.local_experts.gather(dout, "combine backward: output gradients to every expert-TP rank")
        dxs, dws = self.local_experts.backward(expert_caches, dout, xs, ws, self._accumulate)
        # input and gate gradients are partial over expert-TP (each rank's share of w1's columns, w2's rows)
        back = self.local_experts.sum(
            xp.concat([dxs, dws], axis=1), etp_sizes, "backward: sum input and gate gradients over expert-TP"
        )
        back = self.dispatcher.dispatch_backward(back, sizes)
        dx = add_at(xp, xp.zeros((n, h), dtype=dy.dtype), plan.tokens, back[:, :h], plan.token_rounds)
        # d loss / d (each expert's gate), [n, E]: a row's gate gradients go to its slot in the [n * p, per] view
        dper = xp.reshape(
            add_at(
                xp,
                xp.zeros((n * self.dispatcher.p, self.per), dtype=dy.dtype),
                plan.slots,
                back[:, h:],
                plan.slot_rounds,
            ),
            (n, self.gate.experts),
        )
        dx = dx + self.gate.backward(routed, dper, self._accumulate)
        return xp.reshape(dx, shape)

    def _accumulate(self, key: str, g: Array) -> None:
        self._grads[key] = g if key not in self._grads else self._grads[key] + g

    @property
    def grads(self) -> dict[str, Any]:
        """Every weight's gradient, zero for a local expert no token chose: the same keys on every rank of
        the EP group, in a fixed order, so gradient sums line up."""
        xp = self.par.xp
        out = {"router": self._grads.get("router", xp.zeros(self.router.shape, dtype=self.router.dtype))}
        for j, e in enumerate(self.experts):
            for name, w in e.items():
                key = f"expert{self.first + j + 1}.{name}"
                out[key] = self._grads.get(key, xp.zeros(w.shape, dtype=w.dtype))
        return out


class _Dispatch(NamedTuple):
    """One routing's dispatch, worked out in numpy (and handed to the namespace once): the token of each row
    sent (EP rank by EP rank), its slot in the [tokens x EP ranks] grid (token * p + rank), the rows sent to
    each rank, and `add_at`'s gathers onto the tokens and onto the slots."""

    tokens: Array
    slots: Any
    sizes: list[int]
    token_rounds: list[Any]
    slot_rounds: list[Any]


def _rows(a: Array) -> list[list[float]]:
    """a's rows as lists of floats (NaN where an array has no values to give)."""
    return [[float(v) for v in row.tolist()] for row in a]


def softmax(xp: Any, s: Any) -> Any:
    """Softmax over each row, shifted by the row's maximum (scores of 1000 would overflow exp otherwise)."""
    if not s.shape[0]:
        return s
    z = xp.exp(s - xp.max(s, axis=1, keepdims=True))
    return z / xp.sum(z, axis=1, keepdims=True)


def one_hot(xp: Any, chosen: Any, k: int, n_exp: int, dtype: Any) -> Any:
    """[n, k, E] one-hot: entry (t, j, e) is 1 when token t's j-th choice is expert e."""
    picks = xp.reshape(xp.asarray(chosen, dtype=xp.int64), (-1, k))
    return xp.astype(picks[:, :, None] == xp.arange(n_exp, dtype=xp.int64), dtype)


def _take(xp: Any, a: Array, idx: Array) -> Array:
    """The rows `idx` (a list or an index array) of a."""
    return xp.take(a, xp.asarray(idx, dtype=xp.int64), axis=0) if len(idx) else a[:0]


def _gather(xp: Any, a: Array, idx: Array) -> Array:
    """The rows `idx` (an index array of the namespace) of a."""
    return xp.take(a, idx, axis=0) if idx.shape[0] else a[:0]


def _rounds(xp: Any, idx: Array, n: int) -> list[Any]:
    """gather_rounds(idx, n) as index arrays of the namespace, for `add_at`."""
    return [xp.asarray(pos, dtype=xp.int64) for pos in gather_rounds(idx, n)]


def gather_rounds(idx: Array, n: int) -> list[np.ndarray]:
    """How `add_at` adds rows at positions `idx` of an [n, ...] array: per round an [n] index into [a zero
    row; the rows] (0: nothing this round, i + 1: row i). A position named r times takes part in r rounds,
    its rows in the order they come, so the sums are those of adding the rows one at a time."""
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    m = idx.size
    if not m:
        return []
    pos = np.zeros(n, dtype=np.int64)
    pos[idx] = np.arange(1, m + 1)
    if np.count_nonzero(pos) == m:  # no position named twice: one round
        return [pos]
    order = np.argsort(idx.astype(np.uint16) if n <= 1 << 16 else idx, kind="stable")  # small keys: a radix sort
    ranked = idx[order]
    new = np.ones(m, dtype=bool)  # where a position's run of rows starts, in position order
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    seen = np.empty(m, dtype=np.int64)  # how many earlier rows name the same position
    seen[order] = np.arange(m) - np.flatnonzero(new)[np.cumsum(new) - 1]
    rounds = []
    for r in range(int(seen.max()) + 1):
        now = np.flatnonzero(seen == r)
        pos = np.zeros(n, dtype=np.int64)
        pos[idx[now]] = now + 1
        rounds.append(pos)
    return rounds


def add_at(xp: Any, into: Array, idx: Array, rows: Array, rounds: list[Any] | None = None) -> Array:
    """`into` with rows[i] added to its row idx[i], as numpy's np.add.at does (a row named twice gets both, in
    order). Gathers and adds, which every namespace has and arrays without values answer by shape alone
    (moving rows is no arithmetic to count); `rounds`: gather_rounds(idx, len(into)) as the namespace's index
    arrays, if already known."""
    rounds = _rounds(xp, idx, into.shape[0]) if rounds is None else rounds
    if not rounds:
        return into
    padded = xp.concat([xp.zeros((1, *rows.shape[1:]), dtype=rows.dtype), rows], axis=0)
    for pos in rounds:
        into = into + xp.take(padded, pos, axis=0)
    return into


def _unit(xp: Any, j: int, n: int, dtype: Any) -> Any:
    return xp.asarray([1.0 if i == j else 0.0 for i in range(n)], dtype=dtype)


def split_rows(a: Array, sizes: list[int]) -> list:
    """a's rows in consecutive blocks of `sizes`."""
    out, start = [], 0
    for s in sizes:
        out.append(a[start : start + s])
        start += s
    return out
