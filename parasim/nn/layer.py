"""A GPT-style transformer layer split over TP (and SP), forward and backward, and a stack of them.

    x -> LN1 -> attention -> dropout -> + x -> LN2 -> MLP -> dropout -> + -> y     (pre-norm, Megatron's GPT)

Without SP, LN, dropout and the residual adds run on every TP rank on the whole activation; with SP each
rank runs them on its slice of the sequence, the column-parallel blocks all-gather the sequence first and
the row-parallel blocks reduce-scatter it after: forward, the bytes of the all-reduces they replace (backward
gathers the saved slices once more), and 1/t of the activations kept.
Weights come whole from shared seeded streams (`layer_weights`), so the unsplit model is known exactly.
"""

from __future__ import annotations

from typing import Any

from ..comm.interface import Array
from .attention import AttentionOptions, AttentionWeights, HeadCounts, ParallelAttention
from .core import Saved, ParallelContext
from .dropout import Dropout
from .mlp import ParallelMLP
from .moe import MoE
from .norm import LayerNorm
from ..layout import ModelSpec
from ..engine.context import Context


def layer_weights(ctx: Context, shape: ModelSpec, key: str) -> dict[str, Any]:
    """Every weight of one layer, whole, drawn the same on every rank (scaled so activations stay ~1)."""
    h, heads = shape.size("hidden"), shape.size("heads")
    f, d = shape.ffn_size, h // heads
    fe = shape.expert_size  # an expert's width (DeepSeek's are narrower than a dense MLP)
    q, kv = heads * d, shape.kv * d
    # (name, size) in order; each weight is drawn from a stream named after it, so a name is written once.
    # A matrix's std is rows^-1/2 (activations stay about 1), a bias's 0.1.
    sizes: list[tuple[str, tuple[int, ...]]] = [
        ("wq", (h, q)),
        ("wk", (h, kv)),
        ("wv", (h, kv)),
        ("wo", (q, h)),
        ("bq", (q,)),
        ("bk", (kv,)),
        ("bv", (kv,)),
        ("bo", (h,)),
    ]
    if shape.experts:  # each expert is an MLP of its own; the router scores tokens against them
        for e in range(shape.experts):
            sizes += [
                (f"experts.{e}.w1", (h, fe)),
                (f"experts.{e}.w2", (fe, h)),
                (f"experts.{e}.b1", (fe,)),
                (f"experts.{e}.b2", (h,)),
            ]
    else:
        sizes += [("w1", (h, f)), ("w2", (f, h)), ("b1", (f,)), ("b2", (h,))]
    out: dict[str, Any] = {}
    for name, size in sizes:
        bias = len(size) == 1
        out[name] = (
            None
            if bias and not shape.bias
            else ctx.shared_rng(f"{key}.{name}").normal(size, std=0.1 if bias else size[0] ** -0.5)
        )
    if shape.experts:
        out["router"] = ctx.shared_rng(f"{key}.router").normal((h, shape.experts))
    for n in ("ln1", "ln2"):
        out[f"{n}.weight"] = 1.0 + ctx.shared_rng(f"{key}.{n}.w").normal((h,), std=0.1)
        out[f"{n}.bias"] = ctx.shared_rng(f"{key}.{n}.b").normal((h,), std=0.1) if shape.norm == "layernorm" else None
    return out


def expert_weights(weights: dict[str, Any], shape: ModelSpec) -> list[dict[str, Any]]:
    """The experts' weights out of `layer_weights`, one dict per expert, as MoE takes them."""
    return [{k: weights[f"experts.{e}.{k}"] for k in ("w1", "b1", "w2", "b2")} for e in range(shape.experts)]


class TransformerLayer:
    def __init__(
        self, par: ParallelContext, shape: ModelSpec, weights: dict[str, Any], key: str = "layer", name: str = "layer"
    ):
        self.par, self.shape, self.name, self.key = par, shape, name, key
        rms = shape.norm == "rmsnorm"
        self.ln1 = LayerNorm(par, weights["ln1.weight"], weights["ln1.bias"], name=f"{name}.ln1", rms=rms)
        self.attn = ParallelAttention(
            par,
            AttentionWeights.of(weights),
            HeadCounts(shape.size("heads"), shape.kv),
            AttentionOptions(dropout=shape.dropout, flash=shape.flash),
            key=f"{key}.attn",
            name=f"{name}.attn",
        )
        self.drop1 = Dropout(par, shape.dropout, f"{key}.drop1", name=f"{name}.attn dropout")
        self.ln2 = LayerNorm(par, weights["ln2.weight"], weights["ln2.bias"], name=f"{name}.ln2", rms=rms)
        if shape.experts:  # under TP the MoE needs SP, or every TP rank would dispatch the same tokens
            self.mlp: ParallelMLP | MoE = MoE(
                par,
                par.ep_group,
                weights["router"],
                expert_weights(weights, shape),
                shape.k,
                act=shape.act,
                name=f"{name}.moe",
                etp=par.etp_group,
            )
        else:
            self.mlp = ParallelMLP(
                par, weights["w1"], weights["w2"], weights["b1"], weights["b2"], act=shape.act, name=f"{name}.mlp"
            )
        self.drop2 = Dropout(par, shape.dropout, f"{key}.drop2", name=f"{name}.mlp dropout")

    def _where(self, x: Array) -> tuple[tuple[int, ...], tuple]:
        """The whole activation's shape and this rank's slice of it: its CP tokens, then its SP share."""
        par = self.par
        if par.cp_world_size == 1:
            if not par.sp:
                return tuple(x.shape), ()
            n = x.shape[0]
            return (n * par.tp_world_size, *x.shape[1:]), (slice(par.tp_rank * n, (par.tp_rank + 1) * n),)
        return (par.seq, *x.shape[1:]), (par.xp.asarray(par.token_positions()),)

    def forward(self, x: Array, saved: Saved) -> tuple[Array, tuple]:
        full, index = self._where(x) if self.drop1.p or self.drop2.p else ((), ())  # only masks need them
        h, c_ln1 = self.ln1.forward(x, saved)
        a, c_attn = self.attn.forward(h, saved)
        a, m1 = self.drop1.forward(a, saved, full, index)
        x2 = self._mark(saved.tag, "after-attn", x + a)
        h2, c_ln2 = self.ln2.forward(x2, saved)
        m, c_mlp = self.mlp.forward(h2, saved)
        m, m2 = self.drop2.forward(m, saved, full, index)
        y = self._mark(saved.tag, "out", x2 + m)
        return y, (c_ln1, c_attn, m1, c_ln2, c_mlp, m2, saved.tag)

    def backward(self, cache: tuple, dy: Array) -> Array:
        c_ln1, c_attn, m1, c_ln2, c_mlp, m2, tag = cache
        dm = self.drop2.backward(m2, dy)
        dx2 = self._mark(tag, "after-attn.grad", dy + self.ln2.backward(c_ln2, self.mlp.backward(c_mlp, dm)))
        da = self.drop1.backward(m1, dx2)
        return self._mark(tag, "in.grad", dx2 + self.ln1.backward(c_ln1, self.attn.backward(c_attn, da)))

    def _mark(self, tag: str | None, what: str, x: Array) -> Any:
        """With a tag, mark an activation (out, after-attn) or a gradient (in.grad, after-attn.grad) of the
        layer for `parasim check` as `tag.key.what`: this rank holds the rows of its tokens (CP slice, SP
        share) whole, a copy of every other rank's with the same tokens; the unsplit model marks every row."""
        if tag is None:
            return x
        par, n = self.par, x.shape[0]
        rows: list[int] | range
        if par.cp_world_size > 1:
            rows, size = par.token_positions(), par.seq
        else:  # the SP share alone (or every row): a slice of this rank's n tokens out of n * t
            t, r = (par.tp_world_size, par.tp_rank) if par.sp else (1, 0)
            rows, size = range(r * n, (r + 1) * n), n * t
        return par.ctx.mark(f"{tag}.{self.key}.{what}", x, "Replicate()", rows=rows, size=size)

    def _slots(self) -> dict[str, tuple[Any, str]]:
        """Where each weight lives, under the same names as `grads`: (holder, attribute or dict key)."""
        out: dict[str, tuple[Any, str]] = {}
        blocks = [("ln1", self.ln1), ("attn.qkv", self.attn.qkv), ("attn.out", self.attn.out), ("ln2", self.ln2)]
        if isinstance(self.mlp, MoE):
            out["moe.router"] = (self.mlp.gate, "weight")
            for j, e in enumerate(self.mlp.experts):
                out.update({f"moe.expert{self.mlp.first + j + 1}.{k}": (e, k) for k in e})
        else:
            blocks += [("mlp.fc1", self.mlp.fc1), ("mlp.fc2", self.mlp.fc2)]
        for prefix, obj in blocks:
            out.update({f"{prefix}.{k}": (obj, k) for k in ("weight", "bias") if getattr(obj, k, None) is not None})
        return out

    def params(self) -> dict[str, Any]:
        """This rank's weights (its shards under TP, its experts under EP), named as in `grads`."""
        return {k: (h[a] if isinstance(h, dict) else getattr(h, a)) for k, (h, a) in self._slots().items()}

    def load(self, new: dict[str, Any]) -> None:
        """Put updated weights in place (after an optimizer step)."""
        for k, (h, a) in self._slots().items():
            if k in new:
                if isinstance(h, dict):
                    h[a] = new[k]
                else:
                    setattr(h, a, new[k])

    @property
    def grads(self) -> dict[str, Any]:
        return self._named("grads")

    def zero_grad(self) -> None:
        """Forget the gradients backward has added up (an optimizer that already reduced them: ZeRO-3)."""
        for part in (self.ln1, self.attn.qkv, self.attn.out, self.ln2):  # each keeps its own dict
            part.grads.clear()
        if isinstance(self.mlp, MoE):
            self.mlp._grads.clear()  # the MoE block's, under another name
        else:
            self.mlp.fc1.grads.clear()
            self.mlp.fc2.grads.clear()

    @property
    def placements(self) -> dict[str, dict]:
        """Each weight's placement over the mesh axes, named as in `params` and `grads`."""
        return self._named("placements")

    def _named(self, what: str) -> dict[str, Any]:
        out = {}
        for part in ("ln1", "attn", "ln2", "mlp"):
            label = "moe" if part == "mlp" and self.shape.experts else part
            for k, v in getattr(getattr(self, part), what).items():
                out[f"{label}.{k}"] = v
        return out


class Stack:
    """Layers one after another; backward runs them in reverse. Its weights are its layers', each name
    prefixed with the layer's key ('L3.attn.qkv.weight'), so a pipeline stage or an optimizer sees one dict."""

    def __init__(self, layers: list[TransformerLayer]):
        self.layers = layers

    def _prefixed(self, what: str) -> dict[str, Any]:
        return {
            f"{layer.key}.{k}": v
            for layer in self.layers
            for k, v in (getattr(layer, what)() if what == "params" else getattr(layer, what)).items()
        }

    def params(self) -> dict[str, Any]:
        return self._prefixed("params")

    @property
    def grads(self) -> dict[str, Any]:
        return self._prefixed("grads")

    @property
    def placements(self) -> dict[str, dict]:
        return self._prefixed("placements")

    def load(self, new: dict[str, Any]) -> None:
        for layer in self.layers:
            prefix = f"{layer.key}."
            layer.load({k[len(prefix) :]: v for k, v in new.items() if k.startswith(prefix)})

    def forward(self, x: Array, saved: Saved) -> tuple[Any, list]:
        caches = []
        for layer in self.layers:
            x, c = layer.forward(x, saved)
            caches.append(c)
        return x, caches

    def backward(self, caches: list, dy: Array) -> Array:
        for layer, c in zip(reversed(self.layers), reversed(caches)):
            dy = layer.backward(c, dy)
        return dy


class StackWeights:
    """For a pipeline stage built on a Stack: the stack's weights are the stage's."""

    stack: Stack

    def params(self) -> dict[str, Any]:
        return self.stack.params()

    @property
    def grads(self) -> dict[str, Any]:
        return self.stack.grads

    @property
    def placements(self) -> dict[str, dict]:
        return self.stack.placements

    def load(self, new: dict[str, Any]) -> None:
        self.stack.load(new)
