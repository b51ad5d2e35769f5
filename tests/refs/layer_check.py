"""Helpers to run one parallel transformer layer and compare it with torch autograd on the unsplit layer."""
from __future__ import annotations

import math

import numpy as np

import parasim
from parasim.engine.context import Rng
from parasim.nn import ColumnParallelLinear, Saved, ParallelContext
from parasim.nn.attention import head_split
from parasim.nn.embedding import VocabParallelCrossEntropy, VocabParallelEmbedding
from parasim.nn.layer import Stack, TransformerLayer, layer_weights
from parasim.layout import ModelSpec
from parasim.nn.norm import LayerNorm

SEED = 0


def shared(name: str, shape, p: float | None = None, std: float = 1.0) -> np.ndarray:
    rng = Rng(SEED, (1, *name.encode()), lambda a: a)
    if p is not None:
        return (rng.uniform(shape) >= p).astype(float)
    return rng.normal(shape, std=std)


def run_parallel(shape: ModelSpec, tp: int, sp: bool, s: int, b: int, dtype: str = "float64"):
    def program(ctx):
        group = ctx.new_group(range(ctx.world), "tp") if ctx.world > 1 else None
        t = ParallelContext(ctx, group, sp=sp, ep_group=group if shape.experts else None)  # experts over the TP ranks
        weights = {k: None if w is None else w.astype(dtype) for k, w in layer_weights(ctx, shape, "L0").items()}
        layer = TransformerLayer(t, shape, weights, key="L0")
        x = ctx.shared_rng("x").normal((s, b, shape.hidden), dtype)
        dy = ctx.shared_rng("dy").normal((s, b, shape.hidden), dtype)
        if sp:
            x, dy = t.shard(x, 0), t.shard(dy, 0)
        saved = Saved()
        y, cache = layer.forward(x, saved)
        dx = layer.backward(cache, dy)
        return {"y": y, "dx": dx, "grads": layer.grads, "saved": saved.bytes(), "cols": None}
    return parasim.run(program, tp, seed=SEED)


class SharedCtx:
    """Enough of a context for layer_weights: the same shared streams as the ranks use."""

    def shared_rng(self, name):
        return Rng(SEED, (1, *name.encode()), lambda a: a)


def torch_weights(shape: ModelSpec, key: str) -> dict:
    import torch
    return {k: None if v is None else torch.tensor(v, requires_grad=True)
            for k, v in layer_weights(SharedCtx(), shape, key).items()}


def torch_layer(x, W: dict, shape: ModelSpec, key: str):
    """The unsplit layer in torch (float64), dropout masks drawn from the same shared streams."""
    import torch
    import torch.nn.functional as F
    s, b, h = x.shape
    a, kv, p = shape.heads, shape.kv, shape.dropout
    d = h // a

    def norm(z, n):
        if shape.norm == "rmsnorm":
            return z * torch.rsqrt((z * z).mean(-1, keepdim=True) + 1e-5) * W[f"{n}.weight"]
        return F.layer_norm(z, (h,), W[f"{n}.weight"], W[f"{n}.bias"], eps=1e-5)

    def lin(z, w, bias):
        return z @ w + (0 if bias is None else bias)

    def drop(z, name, shp):
        return z if p == 0 else z * torch.tensor(shared(f"{key}.{name}", shp, p=p)) / (1 - p)
    h1 = norm(x, "ln1")
    q = lin(h1, W["wq"], W["bq"]).reshape(s, b, a, d).permute(1, 2, 0, 3)
    k = lin(h1, W["wk"], W["bk"]).reshape(s, b, kv, d).permute(1, 2, 0, 3).repeat_interleave(a // kv, dim=1)
    v = lin(h1, W["wv"], W["bv"]).reshape(s, b, kv, d).permute(1, 2, 0, 3).repeat_interleave(a // kv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = drop(torch.softmax(scores.masked_fill(causal, -math.inf), dim=-1), "attn.probs", (b, a, s, s))
    o = (probs @ v).permute(2, 0, 1, 3).reshape(s, b, a * d)
    x2 = x + drop(lin(o, W["wo"], W["bo"]), "drop1", (s, b, h))
    act = {"gelu": lambda z: F.gelu(z, approximate="tanh"), "relu": F.relu}[shape.act]
    if shape.experts:
        m = torch_moe(norm(x2, "ln2").reshape(-1, h), W, shape, act).reshape(s, b, h)
    else:
        m = lin(act(lin(norm(x2, "ln2"), W["w1"], W["b1"])), W["w2"], W["b2"])
    return x2 + drop(m, "drop2", (s, b, h))


def torch_moe(tokens, W: dict, shape: ModelSpec, act):
    """The unsplit MoE block: top-k experts per token (ties to the lower index), softmax over the k scores."""
    import torch
    n_exp, k = shape.experts, shape.top_k
    logits = tokens @ W["router"]
    top = torch.tensor([sorted(range(n_exp), key=lambda e: (-float(row[e]), e))[:k] for row in logits.detach()])
    gates = torch.softmax(torch.gather(logits, 1, top), dim=1)
    rows = []
    for t in range(tokens.shape[0]):
        out = 0
        for j in range(k):
            e = int(top[t, j])
            hid = act(tokens[t] @ W[f"experts.{e}.w1"] + W[f"experts.{e}.b1"])
            out = out + gates[t, j] * (hid @ W[f"experts.{e}.w2"] + W[f"experts.{e}.b2"])
        rows.append(out)
    return torch.stack(rows)


def reference(shape: ModelSpec, s: int, b: int):
    import torch
    W = torch_weights(shape, "L0")
    x = torch.tensor(shared("x", (s, b, shape.hidden)), requires_grad=True)
    y = torch_layer(x, W, shape, "L0")
    (y * torch.tensor(shared("dy", (s, b, shape.hidden)))).sum().backward()
    return y.detach().numpy(), x.grad.numpy(), {k: (v.grad.numpy() if v.grad is not None else np.zeros(v.shape))
                                                for k, v in W.items() if v is not None}  # unchosen experts: 0


def gather(res, shape: ModelSpec, tp: int, sp: bool) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The split run's output, input grad and full weight grads, put back together."""
    vals = res.values
    cat = (lambda key: np.concatenate([v[key] for v in vals], axis=0)) if sp else (lambda key: vals[0][key])
    if not sp:
        for v in vals:
            assert np.allclose(v["y"], vals[0]["y"], atol=1e-12) and np.allclose(v["dx"], vals[0]["dx"], atol=1e-12)
    return cat("y"), cat("dx"), layer_grads([v["grads"] for v in vals], shape, tp)


def layer_grads(per_rank: list[dict], shape: ModelSpec, tp: int) -> dict[str, np.ndarray]:
    """One layer's full weight gradients from every rank's shard gradients (replicated kv heads summed)."""
    vals = [{"grads": g} for g in per_rank]
    h, a, kv = shape.hidden, shape.heads, shape.kv
    d = h // a
    g: dict[str, np.ndarray] = {}
    g["ln1.weight"], g["ln2.weight"] = vals[0]["grads"]["ln1.weight"], vals[0]["grads"]["ln2.weight"]
    if shape.norm == "layernorm":
        g["ln1.bias"], g["ln2.bias"] = vals[0]["grads"]["ln1.bias"], vals[0]["grads"]["ln2.bias"]
    if shape.experts:  # the router's grads are whole on every rank; each expert's on the rank holding it
        g["router"] = vals[0]["grads"]["moe.router"]
        for e in range(shape.experts):
            for k in ("w1", "b1", "w2", "b2"):
                held = [v["grads"][f"moe.expert{e + 1}.{k}"] for v in vals if f"moe.expert{e + 1}.{k}" in v["grads"]]
                g[f"experts.{e}.{k}"] = held[0] if held else 0.0
    else:
        g["w1"] = np.concatenate([v["grads"]["mlp.fc1.weight"] for v in vals], axis=1)
        g["w2"] = np.concatenate([v["grads"]["mlp.fc2.weight"] for v in vals], axis=0)
    g["wo"] = np.concatenate([v["grads"]["attn.out.weight"] for v in vals], axis=0)
    wq, wk, wv = np.zeros((h, a * d)), np.zeros((h, kv * d)), np.zeros((h, kv * d))
    bq, bk, bv = np.zeros(a * d), np.zeros(kv * d), np.zeros(kv * d)
    for r, v in enumerate(vals):
        qh, kvh = head_split(a, kv, tp, r)
        dw = v["grads"]["attn.qkv.weight"]
        db = v["grads"].get("attn.qkv.bias")
        nq = len(qh) * d
        for i, head in enumerate(qh):
            wq[:, head * d:(head + 1) * d] += dw[:, i * d:(i + 1) * d]
            if db is not None:
                bq[head * d:(head + 1) * d] += db[i * d:(i + 1) * d]
        for i, head in enumerate(kvh):
            off = nq + len(kvh) * d
            wk[:, head * d:(head + 1) * d] += dw[:, nq + i * d:nq + (i + 1) * d]
            wv[:, head * d:(head + 1) * d] += dw[:, off + i * d:off + (i + 1) * d]
            if db is not None:
                bk[head * d:(head + 1) * d] += db[nq + i * d:nq + (i + 1) * d]
                bv[head * d:(head + 1) * d] += db[off + i * d:off + (i + 1) * d]
    g["wq"], g["wk"], g["wv"] = wq, wk, wv
    if shape.bias:
        g["bq"], g["bk"], g["bv"] = bq, bk, bv
        g["bo"] = vals[0]["grads"]["attn.out.bias"]
        if not shape.experts:
            g["b1"] = np.concatenate([v["grads"]["mlp.fc1.bias"] for v in vals], axis=0)
            g["b2"] = vals[0]["grads"]["mlp.fc2.bias"]
    return g


def model_weights(ctx, h: int, vocab: int) -> dict:
    return {"emb": ctx.shared_rng("emb").normal((vocab, h)), "head": ctx.shared_rng("head").normal((h, vocab),
                                                                                                   std=h ** -0.5),
            "lnf.w": 1.0 + ctx.shared_rng("lnf.w").normal((h,), std=0.1), "lnf.b": ctx.shared_rng("lnf.b").normal((h,))}


def data(ctx, s: int, b: int, vocab: int):
    return ctx.shared_rng("ids").integers(0, vocab, (s, b)), ctx.shared_rng("targets").integers(0, vocab, (s, b))


def run_model(shape: ModelSpec, tp: int, sp: bool, s: int, b: int, vocab: int, layers: int, replicas: int = 1):
    """A small GPT on `replicas` TP groups of `tp` ranks (consecutive ranks): the run's result."""
    def program(ctx):
        groups = [ctx.new_group(range(i * tp, (i + 1) * tp), "tp") for i in range(replicas)] if tp > 1 else [None]
        t = ParallelContext(ctx, groups[ctx.rank // tp] if tp > 1 else None, sp=sp)
        w = model_weights(ctx, shape.hidden, vocab)
        emb = VocabParallelEmbedding(t, w["emb"])
        stack = Stack([TransformerLayer(t, shape, layer_weights(ctx, shape, f"L{i}"), key=f"L{i}", name=f"L{i}")
                       for i in range(layers)])
        lnf = LayerNorm(t, w["lnf.w"], w["lnf.b"], name="lnf")
        head = ColumnParallelLinear(t, w["head"], name="head")
        loss_fn = VocabParallelCrossEntropy(t, vocab)
        ids, targets = data(ctx, s, b, vocab)
        saved = Saved()
        x, c_emb = emb.forward(ids, saved)
        x, c_stack = stack.forward(x, saved)
        z, c_lnf = lnf.forward(x, saved)
        logits, c_head = head.forward(z, saved)
        loss, c_loss = loss_fn.forward(logits, targets, saved)
        emb.backward(c_emb, stack.backward(c_stack, lnf.backward(c_lnf, head.backward(c_head,
                                                                                     loss_fn.backward(c_loss)))))
        return {"loss": float(loss), "emb": emb.grads["weight"], "head": head.grads["weight"],
                "lnf": lnf.grads, "layers": [layer.grads for layer in stack.layers], "saved": saved.by_name()}
    return parasim.run(program, tp * replicas, seed=SEED)
