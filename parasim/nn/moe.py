"""A mixture-of-experts block with expert parallelism (EP), forward and backward side by side.

    route:    every rank scores its own tokens against E experts (the router is a small replicated matrix)
              and keeps the top k; the gates are a softmax over those k scores, so they sum to 1
    dispatch: all-to-all over the EP group: each token goes once to every rank owning one of its experts,
              carrying the gates of that rank's experts
    compute:  each rank runs its experts, batched over the rows that chose them, and sums them gate-weighted
    combine:  all-to-all back: one row per (token, rank) returns home and the rows add up

Backward runs the same two all-to-alls in reverse: output gradients go out to the experts, and input
gradients (with the gates' gradients beside them) come back. Experts are whole on one rank (ETP = 1),
placed in contiguous blocks: with E experts over an EP group of p, group rank i holds experts
i*E/p .. (i+1)*E/p - 1. Under SP each TP rank holds different tokens, so none is dispatched twice.

Only array operations of `ctx.xp` touch the data (one-hot choices, gathers, row blocks), so arrays that have
no values (shapes only) run the block unchanged; what needs values (an order of the router's scores, the
rows whose gates are nonzero) is refused by such arrays, and the block says what to do instead. Which token
goes where is worked out in numpy from the routing itself, which is always known.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..comm.interface import Array, Group
from ..errors import ParasimError, UsageError
from ..layout import LayoutError
from .activations import ACTIVATIONS
from .core import ParallelContext, Saved, Weights
from ..layout.placement import Partial, Placement, Replicate, Shard, local, settle
from .routing import GroupLimit, spellings


class MoE(Weights):
    def __init__(self, par: ParallelContext, ep: Group | None, router: Any, experts: list[dict[str, Any]], top_k: int,
                 act: str = "gelu", name: str = "moe", etp: Group | None = None, limit: GroupLimit | None = None):
        """`etp`: the expert-TP group, over which each expert's matrices are split (w1 by columns, w2 by rows,
        as Megatron's expert tensor parallelism does); None: each expert whole on its EP rank. `limit`:
        DeepSeek-V3's node-limited routing, each token's k experts inside the few groups of experts it ranks
        best (nn/routing.py; None: any k experts), the router's and a routing policy's picks alike."""
        n_exp = len(experts)
        self.par, self.ep, self.k, self.act, self.name = par, ep, top_k, act, name
        self.etp = etp if etp is not None and etp.size > 1 else None
        self.q = 1 if self.etp is None else self.etp.size
        self.eme = 0 if self.etp is None else self.etp.group_rank(par.ctx.rank)
        p = 1 if ep is None else ep.size
        if n_exp % p:
            raise LayoutError(f"{n_exp} experts do not split evenly over an EP group of {p}")
        if top_k is None or not 1 <= top_k <= n_exp:
            raise LayoutError(f"top_k must be between 1 and the number of experts ({n_exp}), got {top_k}")
        if limit is not None:
            limit.check(n_exp, top_k)
        self.limit = limit
        xp = par.xp
        self.p, self.per = p, n_exp // p
        self.me = 0 if ep is None else ep.group_rank(par.ctx.rank)
        self.first = self.me * self.per  # global index of this rank's first expert
        self.router = xp.asarray(router, copy=True)
        # the router is whole on every rank; under SP each TP rank routes its own tokens, so its gradient
        # is a partial sum over TP. Each expert lives on one EP rank; over ETP its w1 is split by columns
        # (with b1), w2 by rows; b2 is added once (on ETP rank 0), so its gradient is partial over ETP.
        self.placements: dict[str, dict] = {"router": {"tp": Partial() if par.sp else Replicate()}}
        over_etp: dict[str, Placement] = {"w1": Shard(1), "b1": Shard(0), "w2": Shard(0), "b2": Partial()}
        self.experts = []
        for j in range(self.per):
            whole = {k: v for k, v in experts[self.first + j].items() if v is not None}
            self.experts.append({k: local(v, over_etp[k], self.q, self.eme, xp) for k, v in whole.items()})
            self.placements.update({f"expert{self.first + j + 1}.{k}": {"ep": Shard(0), "etp": over_etp[k]}
                                    if self.q > 1 else {"ep": Shard(0)} for k in whole})
        self._grads: dict[str, Any] = {}
        self._last: tuple = ([], None)  # the last forward's picks and gates: `last_routing`
        self.calls = 0  # forward calls so far: with a routing policy, each names its draws
        # worked out from the routing, kept while the routing is the very same (a policy's cached draws)
        self._arrived: list[np.ndarray] | None = None  # per local expert, the received rows that chose it
        self._last_rows_to: tuple | None = None  # (picks, rows to each EP rank)
        self._last_received: tuple | None = None  # (senders' draws, arrived, sizes)
        self._last_plan: tuple | None = None  # (rows to each EP rank, their _Dispatch)
        self._last_experts: tuple | None = None  # (arrived, received rows, each local expert's rows and gathers)
        # a scripted route for some local tokens (set before a forward): row -> (k experts, k gates). Their
        # gates are constants, so no gradient reaches the router through them (the post's drawn routing)
        self.scripted: dict[int, tuple[tuple[int, ...], tuple[float, ...]]] = {}

    def _locate(self, name: str) -> tuple[Any, str]:
        """'router', or 'expert<n>.<w>' (n counted from 1 over the whole layer): the dict of the local expert."""
        if name == "router":
            return self, name
        expert, key = name.split(".")
        return self.experts[int(expert[len("expert"):]) - 1 - self.first], key

    def owner(self, expert: int) -> int:
        """The EP group rank that holds `expert`."""
        return expert // self.per

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        xp = self.par.xp
        shape = x.shape
        h, n_exp = shape[-1], self.router.shape[1]
        tokens = xp.reshape(x, (-1, h))
        n = tokens.shape[0]
        saved.keep(self.name, "router input", tokens)
        logits = xp.matmul(tokens, self.router)
        chosen = self._route(logits, n, n_exp)  # per token: its k experts, best first
        pick = one_hot(xp, chosen, self.k, n_exp, x.dtype)  # [n, k, E]: choice j of token t is expert e
        gates = softmax(xp, xp.sum(logits[:, None, :] * pick, axis=2))  # [n, k]
        fixed = xp.zeros((n, 1), dtype=x.dtype)  # [n, 1]: 1 for a scripted token
        if self.scripted:
            fixed = xp.asarray([[1.0] if t in self.scripted else [0.0] for t in range(n)], dtype=x.dtype)
            given = xp.asarray([list(self.scripted[t][1]) if t in self.scripted else [0.0] * self.k
                                for t in range(n)], dtype=x.dtype)
            gates = gates * (1.0 - fixed) + given * fixed
        per_expert = xp.sum(gates[:, :, None] * pick, axis=1)  # [n, E]: each expert's gate, 0 if not chosen
        self._last = (chosen, gates)  # read by `last_routing`, for lessons
        # dispatch: one row per (token, EP rank holding one of its experts), rank by rank: the token and the
        # gates of that rank's experts (per_expert's [n * p, per] view: row t * p + d is rank d's columns)
        rows = self._rows_to(chosen)
        plan = self._plan(rows, n)
        sent = xp.concat([_gather(xp, tokens, plan.tokens),
                          _gather(xp, xp.reshape(per_expert, (n * self.p, self.per)), plan.slots)], axis=1)
        got = self._a2a(split_rows(self._wire(sent, "dispatch"), plan.sizes), "dispatch: tokens (and their gates) "
                        "to the ranks holding their experts")
        sizes = [c.shape[0] for c in got]
        recv = self._wire(xp.concat(got, axis=0), "activations")
        self._arrived = self._received(sizes, n, n_exp)  # which of my experts each received row chose (policy)
        # ETP: every rank of the expert-TP group works on the rows any of them received
        recv, etp_sizes = self._etp_gather(recv, "dispatched tokens to every expert-TP rank")
        xs, ws = recv[:, :h], recv[:, h:]
        saved.keep(self.name, "dispatched tokens", xs)
        out, expert_caches = self._experts_forward(xs, ws, saved)
        out = self._etp_sum(out, etp_sizes, "sum the experts' partial outputs over expert-TP")
        back = self._a2a(split_rows(self._wire(out, "combine"), sizes), "combine: expert outputs back to each "
                         "token's rank")
        self._check_back(back, rows)
        y = add_at(xp, xp.zeros((n, h), dtype=x.dtype), plan.tokens, self._wire(xp.concat(back, axis=0), "activations"),
                   plan.token_rounds)
        cache = (shape, tokens, pick, gates, fixed, plan, sizes, etp_sizes, xs, ws, expert_caches)
        return xp.reshape(y, shape), cache

    @property
    def last_routing(self) -> list[list[tuple[int, float]]]:
        """Per local token of the last forward: (expert, gate) for each pick, best first (gates NaN where the
        arrays have no values)."""
        chosen, gates = self._last
        chosen = chosen.tolist() if isinstance(chosen, np.ndarray) else chosen  # plain ints, for notes and JSON
        shown = [] if gates is None else _rows(gates)
        return [list(zip(chosen[t], shown[t])) for t in range(len(chosen))]

    @property
    def last_picks(self) -> np.ndarray:
        """[n, k]: each local token's experts in the last forward, best first (`last_routing` without the
        gates, as one array: cheap for the thousands of tokens of a run at real size)."""
        return np.asarray(self._last[0], dtype=np.int64).reshape(-1, self.k)

    def _route(self, logits: Array, n: int, n_exp: int) -> list[list[int]]:
        """Each token's k experts, best first: scripted ones as given, the others by the routing policy when
        the parallel context has one, else by the router's scores (top k)."""
        policy, key = self.par.options.routing, f"{self.name}#{self.calls}"
        self.calls += 1
        if policy is None:
            top = self._top(logits)
            return [list(self.scripted[t][0]) if t in self.scripted else top[t] for t in range(n)]
        if self.scripted:
            raise UsageError(f"{self.name}: scripted routes and a routing policy do not mix")
        return policy.choose(key, self.par.ctx.rank, self.me * n, n, n_exp, self.k, self.limit)  # [n, k], read-only

    def _top(self, logits: Array) -> list[list[int]]:
        """Each token's k best experts by the router's scores, best first; ties go to the lower index (a
        stable order of the negated scores). Under a group limit, the best among the groups it keeps."""
        try:
            order = self.par.xp.argsort(-logits, axis=1, stable=True)
        except ParasimError as exc:  # arrays without values have no order to give
            raise UsageError(f"{self.name}: no router scores to route by ({exc}); give a routing policy "
                             f"({spellings()})") from None
        if self.limit is not None:  # the groups' scores are sums of the scores: from their values, in numpy
            scores = np.asarray(logits.tolist(), dtype=np.float64).reshape(-1, logits.shape[1])
            return self.limit.top(scores, self.k).tolist()
        return order[:, :self.k].tolist()

    def _rows_to(self, chosen: list[list[int]]) -> list[np.ndarray]:
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

    def _received(self, sizes: list[int], n: int, n_exp: int) -> list[np.ndarray] | None:
        """With a routing policy, for each local expert the received rows that chose it, worked out from the
        senders' policy draws (every EP rank holds n tokens, as the layers split them): no value travels."""
        policy = self.par.options.routing
        if policy is None or self.etp is not None:
            return None
        key = f"{self.name}#{self.calls - 1}"
        srcs = [self.par.ctx.rank] if self.ep is None else self.ep.ranks
        draws = [policy.choose(key, src, d * n, n, n_exp, self.k, self.limit) for d, src in enumerate(srcs)]
        last = self._last_received  # balanced routing: the very same draws every call
        if last is not None and len(last[0]) == len(draws) and all(a is b for a, b in zip(last[0], draws)) \
                and last[2] == sizes:
            return last[1]
        parts: list = []
        seen: dict[int, Any] = {}
        for d, theirs in enumerate(draws):
            mine = seen.get(id(theirs))  # balanced routing: every sender's draws are one array
            if mine is None:
                mine = seen[id(theirs)] = theirs[((theirs // self.per) == self.me).any(axis=1)]  # picks of mine
            if len(mine) != sizes[d]:
                raise UsageError(f"{self.name}: routing by policy needs the same number of tokens on every EP "
                                 f"rank; EP rank {d} sent {sizes[d]} rows, its draws say {len(mine)}")
            parts.append(mine)
        arrived = np.concatenate(parts).reshape(-1, self.k)  # [rows, k]: the experts each row chose
        hit = (arrived[:, :, None] == self.first + np.arange(self.per)).any(axis=1)  # [rows, per]
        rows = [np.flatnonzero(col) for col in hit.T]
        self._last_received = (draws, rows, list(sizes))  # the draws kept alive, so their ids stay theirs
        return rows

    def _plan(self, rows: list[np.ndarray], n: int) -> _Dispatch:
        """Where each dispatched row comes from and goes back to (the same rows give the very same plan)."""
        last = self._last_plan
        if last is not None and last[0] is rows:
            return last[1]
        xp, sizes = self.par.xp, [len(r) for r in rows]
        tokens = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        slots = tokens * self.p + np.repeat(np.arange(self.p), sizes)
        plan = _Dispatch(xp.asarray(tokens, dtype=xp.int64), xp.asarray(slots, dtype=xp.int64), sizes,
                         _rounds(xp, tokens, n), _rounds(xp, slots, n * self.p))
        self._last_plan = (rows, plan)
        return plan

    def _expert_rows(self, ws: Any) -> list[tuple[Any, list[np.ndarray]]]:
        """For each local expert, the received rows that chose it and `add_at`'s gathers onto them: from the
        policy's draws when routing by policy (the very same draws give the very same rows), else from the
        gates that came with the rows (zero for an expert a row did not choose)."""
        arrived, n_rows = self._arrived, ws.shape[0]
        last = self._last_experts
        if arrived is not None and last is not None and last[0] is arrived and last[1] == n_rows:
            return last[2]
        found = []
        for j in range(self.per):
            idx = arrived[j] if arrived is not None else self._gated(ws, j)
            found.append((idx, _rounds(self.par.xp, idx, n_rows)))
        if arrived is not None:
            self._last_experts = (arrived, n_rows, found)
        return found

    def _gated(self, ws: Any, j: int) -> list[int]:
        """The received rows whose gate for local expert j is nonzero."""
        try:
            return self.par.xp.nonzero(ws[:, j] != 0.0)[0].tolist()
        except ParasimError as exc:  # arrays without values have no gates to read
            raise UsageError(f"{self.name}: the rows that chose each expert are read from their gates ({exc}); "
                             "arrays without values route by policy with expert TP 1 only, for now") from None

    def _check_back(self, back: list, rows: list) -> None:
        """Each EP rank returns the rows it was sent. A folded run (a rank running once for several, whose
        chunks the others are given) holds that only when every EP rank receives as many rows: say so, rather
        than fail later on a shape."""
        for d, b in enumerate(back):
            if b.shape[0] != len(rows[d]):
                raise UsageError(f"{self.name}: EP rank {d} returned {b.shape[0]} rows for the {len(rows[d])} sent "
                                 "to it: a folded run needs every EP rank to receive as many rows (balanced "
                                 "routing with a multiple of E tokens per GPU), or run the ranks unfolded")

    def _experts_forward(self, xs: Array, ws: Any, saved: Saved) -> tuple[Any, list]:
        xp = self.par.xp
        act = ACTIVATIONS[self.act][0]
        out = xp.zeros_like(xs)
        caches: list[tuple | None] = []
        for j, (e, (idx, rounds)) in enumerate(zip(self.experts, self._expert_rows(ws))):
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

    # -- backward ------------------------------------------------------------------------------------
    def backward(self, cache: tuple, dy: Array) -> Array:
        par, xp = self.par, self.par.xp
        tp = par.tp_group
        if (tp is not None and tp.size > 1 and not par.sp and self.ep is not None
                and len(set(self.ep.ranks) & set(tp.ranks)) > 1):
            # forward is right (each copy comes home), the expert gradients would not be: Megatron's rule
            raise LayoutError(f"an MoE layer whose EP group shares ranks with TP {par.tp_world_size} needs sequence "
                              "parallelism for backward: without it those ranks route the same tokens and the "
                              "experts' gradients count each token more than once")
        shape, tokens, pick, gates, fixed, plan, sizes, etp_sizes, xs, ws, expert_caches = cache
        h, n, n_exp = shape[-1], tokens.shape[0], self.router.shape[1]
        dtok = xp.reshape(dy, (-1, h))
        outgoing = split_rows(self._wire(_gather(xp, dtok, plan.tokens), "dispatch"), plan.sizes)
        dout = self._wire(xp.concat(self._a2a(outgoing, "combine backward: output gradients out to the experts"),
                                    axis=0), "activations")
        dout, _ = self._etp_gather(dout, "combine backward: output gradients to every expert-TP rank")
        dxs = xp.zeros_like(xs)
        dws = xp.zeros_like(ws)
        for j, c in enumerate(expert_caches):
            if c is not None:
                dxj, dgj = self._expert_backward(j, c, dout)
                dxs = add_at(xp, dxs, c[0], dxj, c[-1])
                dws = add_at(xp, dws, c[0], dgj[:, None] * _unit(xp, j, self.per, xs.dtype)[None, :], c[-1])
        # input and gate gradients are partial over expert-TP (each rank's share of w1's columns, w2's rows)
        back = self._etp_sum(xp.concat([dxs, dws], axis=1), etp_sizes, "backward: sum input and gate gradients "
                             "over expert-TP")
        back = self._wire(xp.concat(self._a2a(split_rows(self._wire(back, "combine"), sizes),
                                              "dispatch backward: input and gate gradients home"), axis=0),
                          "activations")
        dx = add_at(xp, xp.zeros((n, h), dtype=dy.dtype), plan.tokens, back[:, :h], plan.token_rounds)
        # d loss / d (each expert's gate), [n, E]: a row's gate gradients go to its slot in the [n * p, per] view
        dper = xp.reshape(add_at(xp, xp.zeros((n * self.p, self.per), dtype=dy.dtype), plan.slots, back[:, h:],
                                 plan.slot_rounds), (n, n_exp))
        dgates = xp.sum(dper[:, None, :] * pick, axis=2)
        dsel = gates * (dgates - xp.sum(gates * dgates, axis=1, keepdims=True))  # through the softmax
        dsel = dsel * (1.0 - fixed)  # a scripted gate is a constant: nothing flows back to the router
        dlogits = xp.sum(dsel[:, :, None] * pick, axis=1)

        def router_grad() -> None:
            g = xp.matmul(tokens.T, dlogits)
            g = settle(par, self.placements["router"], g, f"{self.name} backward: sum router grad (SP)")
            self._accumulate("router", g)
        par.weight_grad(router_grad)
        dx = dx + xp.matmul(dlogits, self.router.T)
        return xp.reshape(dx, shape)

    def _expert_backward(self, j: int, c: tuple, dout: Array) -> tuple[Any, Any]:
        xp = self.par.xp
        idx, xj, hj, aj, yj, gj, _ = c
        e, key = self.experts[j], f"expert{self.first + j + 1}"
        do = _take(xp, dout, idx)
        dgj = xp.sum(do * yj, axis=1)
        dyj = gj[:, None] * do
        da = xp.matmul(dyj, e["w2"].T)
        dh = ACTIVATIONS[self.act][1](xp, hj, da)

        def weights() -> None:
            self._accumulate(f"{key}.w2", xp.matmul(aj.T, dyj))
            self._accumulate(f"{key}.w1", xp.matmul(xj.T, dh))
            if "b2" in e:
                db2 = xp.sum(dyj, axis=0) if self.eme == 0 else xp.zeros_like(e["b2"])
                self._accumulate(f"{key}.b2", settle(self.par, self.placements[f"{key}.b2"], db2,
                                                     f"{self.name} backward: sum {key}.b2 grad over expert-TP"))
            if "b1" in e:
                self._accumulate(f"{key}.b1", xp.sum(dh, axis=0))
        self.par.weight_grad(weights)
        return xp.matmul(dh, e["w1"].T), dgj

    # -- expert tensor parallelism ------------------------------------------------------------------
    def _etp_gather(self, rows: Array, label: str) -> tuple[Any, list[int]]:
        """Every expert-TP rank's received rows, in group order, on every one of them (counts may differ,
        so an all-to-all that sends each peer the whole block, not an all-gather); and the counts."""
        if self.etp is None:
            return rows, [rows.shape[0]]
        got = self.par.comm.all_to_all([rows] * self.q, dim=0, group=self.etp, label=f"{self.name} {label}")
        return self.par.xp.concat(got, axis=0), [g.shape[0] for g in got]

    def _etp_sum(self, partial: Array, sizes: list[int], label: str) -> Array:
        """The reverse of `_etp_gather`: each rank's own rows, summed over the group's partial results (a
        reduce-scatter with uneven counts, as an all-to-all and a local sum)."""
        if self.etp is None:
            return partial
        got = self.par.comm.all_to_all(split_rows(partial, sizes), dim=0, group=self.etp, label=f"{self.name} {label}")
        total = got[0]
        for g in got[1:]:
            total = total + g
        return total

    # -- helpers -------------------------------------------------------------------------------------
    def _wire(self, rows: Array, kind: str) -> Array:
        """`rows` in the dtype of `kind` when they cross the EP group (the run's precision: what goes toward the
        experts travels as the dispatch, what comes home as the combine, DeepSeek-V3's FP8 and BF16), back in
        the activations' dtype once they have arrived; as they are without an EP group to cross."""
        return rows if self.ep is None or self.p == 1 else self.par.ctx.cast(rows, kind)

    def _a2a(self, chunks: list, label: str) -> list:
        if self.ep is None or self.p == 1:
            return list(chunks)
        return self.par.comm.all_to_all(chunks, dim=0, group=self.ep, label=f"{self.name} {label}")

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
        out.append(a[start:start + s])
        start += s
    return out
