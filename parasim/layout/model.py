"""The model: one type for the engine's layers, the layout rules and the estimator; and the rule for how its
layers sit on pipeline stages (`Stages`, which layout/stages.py reads).

Parameter counts follow from the shapes (attention, MLP or experts, norms, embeddings) unless a stated
count is given: the post quotes its dense model as 27B parameters, and the model-state figures use that.

A few sizes exist for counting real models' parameters exactly (Hugging Face configs): a stated head size,
a shared expert's own width, and multi-head latent attention's ranks (EXACT_SIZES). Left unset (the
default) they change nothing; the engine's layers do not build them, and the activations keep hidden-wide
attention (estimate/models.py's read_hf_config says so for a config that sets them); a shared expert's width
reaches the activations and the clock too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LayoutError


def check_kv(heads: int, kv_heads: int) -> None:
    """Grouped-query attention: query heads come in equal groups, one per key/value head."""
    if heads % kv_heads:
        raise LayoutError(f"heads {heads} do not divide by kv-heads {kv_heads}")


STAGE_LIST_MAX = 65_536  # entries of a stage list: one per pipeline stage, and no layout has more GPUs


@dataclass(frozen=True)
class Stages:
    """The rule that puts a model's layers on pipeline stages (layout/stages.py lists the rules, with
    Megatron's, and answers which layers each stage holds). The default, all fields unset, is Megatron's even
    split."""

    first: int | None = None  # layers on the first stage (Megatron's --decoder-first-pipeline-num-layers)
    last: int | None = None  # layers on the last stage (--decoder-last-pipeline-num-layers)
    embedding: bool = False  # the embedding takes a layer's place on the first stage (--account-for-embedding-...)
    loss: bool = False  # the loss takes a layer's place on the last stage (--account-for-loss-...)
    counts: tuple[int, ...] | None = None  # every stage's layers, first to last
    spread: bool = False  # layers need not divide by pp: the first L mod pp stages take one more

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                # Megatron: "num_layers_in_first_pipeline_stage must be larger than 0"
                raise LayoutError(f"layers on the {name} stage must be a whole number larger than 0, got {v!r}")
        if self.counts is not None:
            if not isinstance(self.counts, tuple) or not self.counts:
                raise LayoutError("a stage list needs one layer count per stage")
            if len(self.counts) > STAGE_LIST_MAX:
                raise LayoutError(
                    f"a stage list of {len(self.counts):,} stages is more than the limit of {STAGE_LIST_MAX:,}"
                )
            bad = [v for v in self.counts if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1]
            if bad:
                raise LayoutError(
                    f"every stage needs a whole number of layers, at least 1, got {bad[0]!r} in the stage list"
                )
        kinds = [
            k
            for k, on in (
                ("a stage list", self.counts is not None),
                ("first/last stage layers", self.first is not None or self.last is not None),
                ("the embedding or loss counted in the split", self.embedding or self.loss),
                ("the as-even-as-can-be split", self.spread),
            )
            if on
        ]
        if len(kinds) > 1:  # Megatron refuses first/last with the embedding or loss counted, and a layout with both
            raise LayoutError(f"give one rule for the layers on stages, not {' and '.join(kinds)}")

    @property
    def given(self) -> bool:
        """Whether a rule other than the even split's is set."""
        return self != Stages()

    def check_layers(self, layers: int) -> None:
        """The rule's own limits against the model's layers, whatever pp is."""
        if self.counts is not None and sum(self.counts) != layers:
            raise LayoutError(f"the stage list holds {sum(self.counts):,} layers, the model has {layers:,}")
        fixed = (self.first or 0) + (self.last or 0)
        if fixed > layers:
            raise LayoutError(f"first and last stage layers ({fixed:,}) exceed the model's {layers:,} layers")

    def to_dict(self) -> dict[str, Any]:
        """The rule as JSON: its kind and what it states."""
        if self.counts is not None:
            return {"rule": "list", "counts": list(self.counts)}
        if self.first is not None or self.last is not None:
            return {"rule": "first/last", "first": self.first, "last": self.last}
        if self.embedding or self.loss:
            return {"rule": "embedding/loss", "embedding": self.embedding, "loss": self.loss}
        return {"rule": "spread" if self.spread else "even"}


SPREAD = Stages(spread=True)


def _rule(model: Any) -> Stages:
    return model.stages


@dataclass(frozen=True)
class ModelSpec:
    """A transformer's shapes: one type for the engine's layers, the layouts' rules and the estimator.

    Sizes left None are unknown: the layout rules that need them are skipped, and the estimator asks for
    the ones it needs (`require`)."""

    name: str = ""
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    kv_heads: int | None = None  # grouped-query attention: key/value heads (default: heads)
    ffn: int | None = None  # dense MLP width (default 4 * hidden)
    experts: int = 0  # routed experts per MoE layer; 0 = dense model
    top_k: int | None = None  # experts each token is routed to
    expert_ffn: int | None = None  # one expert's MLP width (default: ffn)
    shared_experts: int = 0  # experts every token visits (DeepSeek)
    # group-limited routing (DeepSeek-V3's n_group and topk_group): the experts in `expert_groups` equal groups,
    # a token's k experts picked from its `groups_kept` best groups only (None: from all the experts)
    expert_groups: int | None = None
    groups_kept: int | None = None
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    gated: bool = False  # SwiGLU-style MLP: three matrices instead of two
    tied_embeddings: bool = False
    stages: Stages = Stages()  # how the layers sit on pipeline stages (layout/stages.py; default: evenly)
    params: float | None = None  # a stated parameter count; overrides the count from shapes
    seq: int | None = None  # a worked example's sequence length (CP's split must divide it)
    micro_batch: int | None = None
    tokens: tuple[str, ...] = ()  # a worked example's words, for traces
    # how the engine's layers compute (the estimator counts shapes only)
    dropout: float = 0.0
    act: str = "gelu"
    norm: str = "layernorm"  # or "rmsnorm"
    bias: bool = True
    flash: bool = False  # do not keep the attention scores (FlashAttention)
    # sizes for counting real models' parameters exactly (EXACT_SIZES; None keeps every figure as it was). The
    # parameter count uses them all; the clock only the attention sizes (its matmuls through attention_params,
    # CP's keys and values through head_dim); the activations keep hidden-wide multi-head attention. A shared
    # expert's width counts everywhere: parameters, activations (estimate/memory.py) and the clock
    shared_expert_ffn: int | None = None  # one shared expert's MLP width (default: expert_ffn; Qwen2-MoE's is wider)
    head_size: int | None = None  # one attention head's width, stated when not hidden / heads (Qwen3-MoE)
    # multi-head latent attention (DeepSeek-V2/V3), kv_lora_rank None = plain attention
    q_lora_rank: int | None = None  # queries through a latent of this rank (None: one full query projection)
    kv_lora_rank: int | None = None  # keys and values through one shared latent of this rank
    qk_nope_head_dim: int | None = None  # each head's query/key width without rotary position
    qk_rope_head_dim: int | None = None  # the rotary part (its key projected once from the input, shared by heads)
    v_head_dim: int | None = None  # each head's value width

    def __post_init__(self) -> None:
        for f in (
            "layers",
            "hidden",
            "heads",
            "vocab",
            "kv_heads",
            "ffn",
            "expert_ffn",
            "seq",
            "micro_batch",
            *EXACT_SIZES,
        ):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise LayoutError(f"model {f} must be a positive integer, got {v!r}")
        # a stated head size need not divide the hidden size (Qwen3-30B-A3B: 32 heads of 128 on hidden 2048)
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads and self.head_size is None:
            raise LayoutError(f"hidden {self.hidden} does not divide by heads {self.heads}")
        mla = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if self.kv_lora_rank is None:
            given = [f for f in mla if getattr(self, f) is not None]
            if given:
                raise LayoutError(f"latent attention's {', '.join(given)} need its kv_lora_rank")
        else:
            lacking = [f for f in mla[1:] if getattr(self, f) is None]
            if lacking:
                raise LayoutError(f"latent attention (kv_lora_rank {self.kv_lora_rank}) lacks {', '.join(lacking)}")
            if self.head_size is not None:
                raise LayoutError("a stated head size and latent attention's sizes exclude each other")
        if self.heads is not None and self.kv_heads is not None:
            check_kv(self.heads, self.kv_heads)
        if self.experts and self.top_k is not None and not 1 <= self.top_k <= self.experts:
            raise LayoutError(f"top-k must be between 1 and experts {self.experts}, got {self.top_k}")
        if (self.expert_groups is None) != (self.groups_kept is None):
            raise LayoutError("group-limited routing needs both expert_groups and groups_kept")
        g, kept = self.expert_groups, self.groups_kept
        if g is not None and kept is not None and self.experts:  # (a dense copy of an MoE model keeps them, unused)
            if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in (g, kept)):
                raise LayoutError(f"expert_groups and groups_kept must be positive integers, got {g!r}, {kept!r}")
            if self.experts % g or kept > g:
                raise LayoutError(f"{self.experts} experts do not fall into {g} groups of which {kept} are kept")
            if self.top_k is not None and self.experts // g * kept < self.top_k:
                raise LayoutError(
                    f"{kept} kept groups of {self.experts // g} experts hold fewer than top-k {self.top_k}"
                )
        if self.layers is not None and self.dense_layers > self.layers:
            raise LayoutError(f"dense layers {self.dense_layers} exceed layers {self.layers}")
        if not isinstance(self.stages, Stages):
            raise LayoutError(f"model stages must be a Stages rule, got {self.stages!r}")
        if self.layers is not None:
            self.stages.check_layers(self.layers)

    def require(self, *fields: str) -> "ModelSpec":
        """This model, if it gives every one of `fields` (an MoE model also its top-k)."""
        missing = [f for f in fields if getattr(self, f) is None]
        if self.experts and self.top_k is None:
            missing.append("top_k")
        if missing:
            raise self._lacking(missing)
        return self

    def size(self, name: str) -> int:
        """The size `name` (layers, hidden, seq, top_k, ...), given (a model that lacks it says so)."""
        value = getattr(self, name)
        if value is None:
            raise self._lacking([name])
        return int(value)

    def _lacking(self, missing: list[str]) -> LayoutError:
        """The one error for sizes a model does not give (`require`, `size`, `k`)."""
        return LayoutError(
            f"model {self.name or '(unnamed)'} lacks {', '.join(missing)}"
            + (" (an MoE model needs its top-k: --top-k)" if "top_k" in missing else "")
        )

    # -- shapes --------------------------------------------------------------------------------------
    @property
    def kv(self) -> int:
        return self.kv_heads or self.size("heads")

    @property
    def head_dim(self) -> int:
        """One head's width: the stated one, else hidden / heads (also under latent attention, which the
        activations and time model as plain multi-head attention)."""
        return self.head_size or self.size("hidden") // self.size("heads")

    @property
    def k(self) -> int:
        """The experts each token is routed to (an MoE model's top-k, which `require` asks for)."""
        return self.size("top_k")

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (DeepSeek): keys and values through a low-rank latent."""
        return self.kv_lora_rank is not None

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.size("hidden")

    @property
    def expert_size(self) -> int:
        return self.expert_ffn or self.ffn_size

    @property
    def shared_size(self) -> int:
        return self.shared_expert_ffn or self.expert_size

    @property
    def moe_layers(self) -> int:
        return self.size("layers") - self.dense_layers if self.experts else 0

    @property
    def mlp_mats(self) -> int:
        return 3 if self.gated else 2

    # -- parameter counts (weights only; biases and norms are a rounding error at this scale) ----------
    def attention_params(self) -> int:
        if self.latent:
            return self.latent_attention_params()
        h, d = self.size("hidden"), self.head_dim
        return h * (self.size("heads") * d) * 2 + h * (2 * self.kv * d)  # Q and O, then K and V

    def latent_attention_params(self) -> int:
        """Multi-head latent attention's projections (DeepSeek-V2 report, section 2.1): queries down to
        q_lora_rank and up to every head's no-rope and rope parts (or straight up without q_lora_rank); the
        input down to the kv latent plus the one shared rotary key; the latent up to every head's no-rope
        key and value; the values out to hidden. The two latents' norms are counted with the norms."""
        h, n, r = self.size("hidden"), self.size("heads"), self.q_lora_rank
        rank, nope, rope, v = self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        assert rank is not None and nope is not None and rope is not None and v is not None  # latent's sizes, checked
        q = h * r + r * n * (nope + rope) if r else h * n * (nope + rope)
        kv = h * (rank + rope) + rank * n * (nope + v)
        return q + kv + n * v * h

    def mlp_params(self, width: int) -> int:
        return self.mlp_mats * self.size("hidden") * width

    def counted(self) -> dict[str, float]:
        """Parameters by part, from the shapes: attention, dense MLP, routed experts, shared experts,
        embeddings (input and output head), norms."""
        layers, hidden, vocab = self.size("layers"), self.size("hidden"), self.size("vocab")
        dense_mlp = layers - self.moe_layers
        emb = vocab * hidden * (1 if self.tied_embeddings else 2)
        return {
            "attention": float(layers * self.attention_params()),
            "dense mlp": float(dense_mlp * self.mlp_params(self.ffn_size)),
            "routed experts": float(self.moe_layers * self.experts * self.mlp_params(self.expert_size)),
            "shared experts": float(self.moe_layers * self.shared_experts * self.mlp_params(self.shared_size)),
            "router": float(self.moe_layers * self.experts * hidden),
            "embeddings": float(emb),
            "norms": float(layers * self.norm_width()),
        }

    def norm_width(self) -> int:
        """Norm weights per layer: the two before attention and MLP, and latent attention's two latents'."""
        return 2 * self.size("hidden") + (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)

    def total_params(self) -> float:
        return float(self.params) if self.params else sum(self.counted().values())

    def expert_params(self) -> float:
        """Routed-expert parameters (split over EP rather than TP), scaled to a stated total."""
        c = self.counted()
        return c["routed experts"] * self.total_params() / sum(c.values())

    def active_params(self) -> float:
        """Parameters one token passes through (top-k of the routed experts), without the embeddings:
        what the 6 * params * tokens rule counts."""
        c = self.counted()
        scale = self.total_params() / sum(c.values())
        routed = c["routed experts"] * self.k / self.experts if self.experts else 0.0
        return (sum(c.values()) - c["routed experts"] - c["embeddings"] + routed) * scale

    def param_counts(self) -> dict[str, float]:
        """The counts --json reports, each named for what it holds: every parameter; those one token passes
        through without the embeddings and output head (the 6 * params * tokens rule's); and with them (as model
        cards count active parameters)."""
        c = self.counted()
        active = self.active_params()
        return {
            "params": self.total_params(),
            "active_params": active,
            "active_params_with_embeddings": active + c["embeddings"] * self.total_params() / sum(c.values()),
        }

    def to_dict(self) -> dict[str, Any]:
        """The shapes and counts; the exact-count sizes (EXACT_SIZES) only where set."""
        out = {
            "name": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv,
            "vocab": self.vocab,
            "ffn": self.ffn_size,
            "experts": self.experts,
            "top_k": self.top_k or 0,
            "expert_ffn": self.expert_size if self.experts else None,
            "shared_experts": self.shared_experts,
            "dense_layers": self.dense_layers,
            "gated": self.gated,
        }
        out.update({f: getattr(self, f) for f in EXACT_SIZES if getattr(self, f) is not None})
        return {**out, **self.param_counts()}


# sizes for counting real models' parameters exactly (the head size also sizes the clock's CP keys and
# values, through head_dim); None, the default, leaves every figure as it was
EXACT_SIZES = (
    "shared_expert_ffn",
    "head_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
