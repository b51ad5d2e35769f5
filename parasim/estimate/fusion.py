"""How a framework runs a layer's elementwise work, as the clock's plan times it (clock/plan.py): the passes
of each kernel split, the bytes each reads and writes per value of what it runs over, and what the loss moves
per logit. One entry per framework split (FUSIONS); `Plan.fusion` names one, and nothing here imports the
rest of parasim, so the plan (estimate/memory.py) can check the name where it is made.
"""

from __future__ import annotations

from dataclasses import dataclass


# Elementwise passes of one layer's forward: (name, the tensor it runs over, bytes read and written per value
# of it). "act": the activations [tokens, hidden] (split over TP under SP, whole on each TP rank without);
# "ffn": the MLP's hidden [tokens, ffn / TP]; "scores": the attention scores [b, heads / TP, s_q, s_k], only
# where FlashAttention does not keep them inside its kernel. 16-bit values are 2 bytes, a dropout mask 1.
# A backward pass moves about twice its forward's bytes (it reads what the forward read and the incoming
# gradient, and writes the gradient): BACKWARD_BYTES.
ELEMENTWISE: tuple[tuple[str, str, float, float], ...] = (
    # name, over, bytes per value with dropout, without
    ("input norm", "act", 4, 4),  # read x, write norm(x)
    ("attention bias, dropout, residual", "act", 7, 6),  # read out and residual, write sum (and a mask)
    ("post-attention norm", "act", 4, 4),
    ("MLP activation", "ffn", 4, 4),  # GeLU: read, write (a gated MLP reads two: GATED_EXTRA)
    ("MLP bias, dropout, residual", "act", 7, 6),
    ("softmax (scale, mask)", "scores", 4, 4),  # read scores, write probabilities
    ("attention dropout", "scores", 5, 0),  # read, write, mask
)
GATED_EXTRA = 2  # a gated MLP's activation reads a second input of the same size

# The same layer as eager PyTorch runs it, one kernel per operation, read from torchtitan's Llama
# (torchtitan/models/norms.py RMSNorm, torchtitan/models/llama/model.py: apply_rotary_emb, repeat_kv, the SDPA
# output made contiguous, FeedForward's F.silu(w1(x)) * w3(x); late 2024, without torch.compile). Bytes per
# value of what each runs over: "heads" is the attention's width on one GPU [tokens, hidden / TP], "qk" the
# queries and keys together [tokens, (heads + kv heads) x head dim / TP], "kvrep" the same where K and V are
# repeated to every head (zero where every head has its own).
TORCH_EAGER: tuple[tuple[str, str, float, float], ...] = (
    # RMSNorm in FP32: x.float() 2+4, pow(2) 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2
    ("input norm", "act", 36, 36),
    ("rotary embedding: q, k to FP32, a complex multiply, back to 16 bits", "qk", 20, 20),  # 2+4, 4+4, 4+2
    ("K and V repeated to every head (expand, then a copy)", "kvrep", 4, 4),  # read kv heads, write all, 2 B
    ("attention output transposed and made contiguous", "heads", 4, 4),
    ("attention residual add", "act", 6, 6),
    ("post-attention norm", "act", 36, 36),
    ("MLP activation: SiLU of the gate, times the up projection", "ffn", 10, 10),  # 2+2, then 4+2
    ("MLP residual add", "act", 6, 6),
)


@dataclass(frozen=True)
class Fusion:
    """How a framework splits a layer's elementwise work into kernels: its passes, what a gated MLP adds to
    the "ffn" rows, and the bytes per logit its loss moves forward and backward (None: three passes of the
    precision's logits dtype, written, read by the loss, their gradient written)."""

    passes: tuple[tuple[str, str, float, float], ...]
    gated_extra: float
    logits_bytes: float | None
    source: str


FUSIONS: dict[str, Fusion] = {
    "megatron": Fusion(
        ELEMENTWISE,
        GATED_EXTRA,
        None,
        "Megatron-LM / TransformerEngine's fused kernels (bias, dropout and residual in one; "
        "LayerNorm or RMSNorm in one)",
    ),
    # cross_entropy(pred.float()): cast 2+4, log_softmax 4+4; backward the loss's gradient 4, log_softmax's
    # 4+4+4, the cast's 4+2
    "torch-eager": Fusion(
        TORCH_EAGER,
        0.0,
        36.0,
        "eager PyTorch as torchtitan's Llama runs it without torch.compile (models/norms.py, "
        "models/llama/model.py, train.py's cross_entropy(pred.float()))",
    ),
}
