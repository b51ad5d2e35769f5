"""Megatron-LM's training flags, one table entry each: what parasim takes from a flag, or why a flag that
changes memory, traffic or time is left out. Read by the reader (a job's flags -> model, layout, plan)
and by the writer (a plan -> the flags that give it back), so the two cannot drift apart.

Flag names and defaults are Megatron-LM's (megatron/training/arguments.py and the TransformerConfig and
ModelParallelConfig fields it turns into flags), read from its source; this is our own code.
"""

from __future__ import annotations

from dataclasses import dataclass

# Megatron's defaults where a flag is absent (arguments.py)
DEFAULT_TOPK = 2  # --moe-router-topk
DEFAULT_DIVISIBLE_BY = 128  # --make-vocab-size-divisible-by: the vocabulary is padded to this x TP
DEFAULT_DROPOUT = 0.1  # --hidden-dropout and --attention-dropout
# --multi-latent-attention's sizes when their flags are absent (arguments.py's _add_mla_args)
MLA_DEFAULTS = {
    "--q-lora-rank": None,
    "--kv-lora-rank": 32,
    "--qk-head-dim": 128,
    "--qk-pos-emb-head-dim": 64,
    "--v-head-dim": 128,
}
MLA_FIELDS = {
    "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank",
    "--qk-head-dim": "qk_nope_head_dim",
    "--qk-pos-emb-head-dim": "qk_rope_head_dim",
    "--v-head-dim": "v_head_dim",
}
# --tokenizer-type -> its vocabulary, for jobs that give no --vocab-size: GPT-2's byte-level BPE (50,257
# tokens, Radford et al. 2019) and Llama 2's SentencePiece model (32,000, Touvron et al. 2023)
TOKENIZERS = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
# Megatron-LM's precision flags for each entry of layout/precision.py it has a setting for (megatron/arguments.py:
# --bf16 accumulates and reduces gradients in FP32 unless --grad-reduce-in-bf16; --fp16 keeps FP16 gradients
# unless --accumulate-allreduce-grads-in-fp32; neither is FP32). The reader and the writer both read it.
PRECISION_FLAGS: dict[str, tuple[str, ...]] = {
    "megatron-bf16": ("--bf16",),
    "megatron-bf16-reduce-bf16": ("--bf16", "--grad-reduce-in-bf16"),
    "megatron-fp16": ("--fp16",),
    "megatron-fp16-grads-fp32": ("--fp16", "--accumulate-allreduce-grads-in-fp32"),
    "fp32": (),
}
# FP8 linears (TransformerEngine) on either BF16 setting, by --fp8-recipe (layout/precision.py's MEGATRON_FP8;
# Megatron's default recipe, delayed, is not written); --fp8-format hybrid (E4M3 forward, E5M2 gradients) or e4m3
# casts the same bytes. Other recipes (mxfp8: Blackwell only, custom) have no cast cost here: the reader leaves
# them, saying so.
DEFAULT_FP8_RECIPE = "delayed"
FP8_FORMAT = {"delayed": "hybrid", "tensorwise": "hybrid", "blockwise": "e4m3"}  # what the writer gives
for _base in ("megatron-bf16", "megatron-bf16-reduce-bf16"):
    for _recipe, _format in FP8_FORMAT.items():
        PRECISION_FLAGS[f"{_base}-fp8-{_recipe}"] = (
            PRECISION_FLAGS[_base]
            + ("--fp8-format", _format)
            + (() if _recipe == DEFAULT_FP8_RECIPE else ("--fp8-recipe", _recipe))
        )
        # the weights kept and all-gathered in FP8 (layout/precision.py's -gather entries)
        PRECISION_FLAGS[f"{_base}-fp8-{_recipe}-gather"] = PRECISION_FLAGS[f"{_base}-fp8-{_recipe}"] + (
            "--fp8-param-gather",
        )
# the Megatron-LM setting nearest each entry it has no flags for: what `--megatron-args` writes, saying so
NEAREST_PRECISION = {
    "post": "megatron-bf16-reduce-bf16",
    "fsdp2": "megatron-bf16",
    "deepseek-v3": "megatron-bf16-fp8-blockwise",
    "fp64": "fp32",
    "fsdp2-fp8": "megatron-bf16-fp8-tensorwise",
    "fsdp2-fp8-gather": "megatron-bf16-fp8-tensorwise-gather",
    "deepspeed-fp16": "megatron-fp16",
    "bf16-pure": "megatron-bf16-reduce-bf16",
    "bf16-pure-dp": "megatron-bf16",
}
SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}  # Megatron-FSDP -> ZeRO


@dataclass(frozen=True)
class Flag:
    """One Megatron flag. `takes`: 0 for a switch, 1 for one value, -1 for every word up to the next flag.
    `role`: "used" (parasim reads it: `means` says as what), "unmodelled" (it changes memory, traffic or time
    and parasim leaves that out: `means` says what), "none" (nothing parasim counts changes)."""

    takes: int
    role: str
    means: str = ""


def _used(takes: int, means: str) -> Flag:
    return Flag(takes, "used", means)


def _left(takes: int, means: str) -> Flag:
    return Flag(takes, "unmodelled", means)


FLAGS: dict[str, Flag] = {
    # the model
    "--num-layers": _used(1, "layers"),
    "--hidden-size": _used(1, "hidden size"),
    "--num-attention-heads": _used(1, "attention heads"),
    "--ffn-hidden-size": _used(
        1, "MLP width (Megatron's default: 4 x hidden, or 8/3 x hidden rounded down to 64 with --swiglu)"
    ),
    "--group-query-attention": _used(0, "grouped-query attention: --num-query-groups key/value heads"),
    "--num-query-groups": _used(1, "key/value heads (with --group-query-attention)"),
    "--kv-channels": _used(1, "the size of one head"),
    "--seq-length": _used(1, "sequence length"),
    "--vocab-size": _used(
        1, "vocabulary, padded as Megatron pads it (to a multiple of --make-vocab-size-divisible-by x TP)"
    ),
    "--make-vocab-size-divisible-by": _used(1, "the vocabulary's padding"),
    "--swiglu": _used(0, "gated MLP: three matrices"),
    "--disable-bias-linear": _used(0, "no biases"),
    "--normalization": _used(1, "the norm (LayerNorm or RMSNorm)"),
    "--untie-embeddings-and-output-weights": _used(
        0, "the output layer has its own weights (Megatron ties them by default)"
    ),
    "--num-experts": _used(1, "routed experts per MoE layer"),
    "--moe-router-topk": _used(1, "experts per token"),
    "--moe-ffn-hidden-size": _used(1, "one expert's MLP width"),
    "--moe-shared-expert-intermediate-size": _used(1, "the shared experts' width (in experts of the routed width)"),
    "--moe-layer-freq": _used(1, "which layers are MoE (dense layers first)"),
    "--hidden-dropout": _used(1, "dropout (masks kept unless both dropouts are 0)"),
    "--attention-dropout": _used(1, "dropout (masks kept unless both dropouts are 0)"),
    "--attention-backend": _used(1, "FlashAttention (flash, fused, auto) or whole scores kept (unfused, local)"),
    "--use-flash-attn": _used(0, "FlashAttention: the scores are not kept"),
    "--moe-token-dispatcher-type": _used(
        1, "how tokens reach their experts: alltoall (NCCL's all-to-all) or flex (DeepEP, HybridEP)"
    ),
    "--bf16": _used(
        0,
        "mixed precision: BF16 weights and products, FP32 gradients, master weights and Adam "
        "state (precision megatron-bf16)",
    ),
    "--fp16": _used(
        0,
        "mixed precision: FP16 weights, products and gradients, FP32 main gradients, master "
        "weights and Adam state (precision megatron-fp16)",
    ),
    "--grad-reduce-in-bf16": _used(
        0, "with --bf16: BF16 gradients, reduced in BF16 (precision megatron-bf16-reduce-bf16)"
    ),
    "--accumulate-allreduce-grads-in-fp32": _used(0, "FP32 gradients, reduced in FP32 (the default with --bf16)"),
    # the layout
    "--tensor-model-parallel-size": _used(1, "TP"),
    "--pipeline-model-parallel-size": _used(1, "PP"),
    "--context-parallel-size": _used(1, "CP"),
    "--expert-model-parallel-size": _used(1, "EP"),
    "--expert-tensor-parallel-size": _used(1, "ETP"),
    "--sequence-parallel": _used(0, "SP (Megatron turns it off when TP is 1)"),
    "--use-tp-pp-dp-mapping": _used(0, "rank order tp-cp-ep-pp-dp"),
    "--use-distributed-optimizer": _used(0, "ZeRO-1: the optimizer state sharded over DP x CP"),
    "--use-megatron-fsdp": _used(0, "Megatron-FSDP: the ZeRO stage its --data-parallel-sharding-strategy gives"),
    "--data-parallel-sharding-strategy": _used(
        1, "Megatron-FSDP's sharding: no_shard, optim, optim_grads, optim_grads_params (ZeRO 0-3)"
    ),
    "--use-torch-fsdp2": _used(0, "PyTorch FSDP2: weights, gradients and optimizer state sharded (ZeRO-3)"),
    "--num-layers-per-virtual-pipeline-stage": _used(1, "interleaved 1F1B: model chunks per GPU"),
    "--num-virtual-stages-per-pipeline-rank": _used(1, "interleaved 1F1B: model chunks per GPU"),
    # the step
    "--micro-batch-size": _used(1, "sequences per micro-batch"),
    "--global-batch-size": _used(1, "micro-batches per step: global / (micro-batch x DP)"),
    "--recompute-activations": _used(0, "selective recomputation"),
    "--recompute-granularity": _used(1, "recomputation: full or selective"),
    "--recompute-method": _used(1, "full recomputation's method (parasim: uniform, one layer at a time)"),
    "--recompute-num-layers": _used(1, "layers recomputed together (parasim: 1)"),
    "--overlap-grad-reduce": _used(0, "the step's time: the gradient reduction runs beside the backward"),
    "--overlap-param-gather": _used(0, "the step's time: the parameter all-gather runs beside the forward"),
    "--tp-comm-overlap": _used(0, "the step's time: TP collectives run beside the products"),
    "--overlap-p2p-communication": _used(0, "the step's time: pipeline sends run beside compute"),
    "--cp-comm-type": _used(1, "CP's exchange (parasim: p2p, the K/V ring, or all_gather)"),
    # changes memory, traffic or time; not modelled
    "--fp8-format": _used(1, "FP8 linears: products in FP8, their inputs, weights and gradients cast (with --bf16)"),
    "--fp8-recipe": _used(1, "how FP8's scales are found: delayed, tensorwise (current) or blockwise casts"),
    "--fp8-param-gather": _used(0, "the weights kept and all-gathered in FP8 (with --fp8-format)"),
    "--use-precision-aware-optimizer": _left(0, "optimizer state in lower precision: parasim keeps FP32 Adam state"),
    "--main-grads-dtype": _left(1, "the gradient buffer's dtype: parasim keeps FP32 gradients"),
    "--main-params-dtype": _left(1, "the master weights' dtype: parasim keeps FP32 master weights"),
    "--exp-avg-dtype": _left(1, "Adam's first moment's dtype: parasim keeps it in FP32"),
    "--exp-avg-sq-dtype": _left(1, "Adam's second moment's dtype: parasim keeps it in FP32"),
    "--megatron-fsdp-grad-comm-dtype": _left(1, "gradients reduced in another dtype: parasim reduces in FP32"),
    "--megatron-fsdp-main-grads-dtype": _left(1, "the gradient buffer's dtype: parasim keeps FP32 gradients"),
    "--num-distributed-optimizer-instances": _left(
        1, "several optimizer shards' copies: parasim shards over all of DP x CP once"
    ),
    "--recompute-modules": _left(
        -1, "selective recomputation of chosen modules: parasim's selective recomputes attention's core only"
    ),
    "--cpu-offloading": _left(0, "activations or weights offloaded to the CPU: parasim keeps everything on the GPU"),
    "--cpu-offloading-num-layers": _left(1, "activations offloaded to the CPU: parasim keeps them on the GPU"),
    "--cross-entropy-loss-fusion": _left(0, "fused cross-entropy: parasim counts the loss's logits unfused"),
    "--moe-grouped-gemm": _left(0, "grouped expert products: parasim times each expert's product as a dense one"),
    "--moe-expert-capacity-factor": _left(1, "expert capacity: dropped or padded tokens change the experts' work"),
    "--moe-pad-expert-input-to-capacity": _left(0, "experts padded to capacity: more work and memory than routed"),
    "--moe-router-topk-limited-devices": _left(1, "device-limited routing: fewer GPUs per token, less traffic"),
    "--moe-router-num-groups": _used(1, "group-limited routing: the experts in this many groups"),
    "--moe-router-group-topk": _used(1, "group-limited routing: a token's experts from this many groups"),
    "--moe-flex-dispatcher-backend": _used(
        1, "the flex dispatcher's kernels: deepep or hybridep (a token once to each GPU and node that needs it)"
    ),
    "--moe-enable-deepep": _used(0, "the flex dispatcher with DeepEP (Megatron's older flag)"),
    "--moe-shared-expert-overlap": _left(0, "the shared expert runs beside the dispatch: parasim runs it after"),
    "--overlap-moe-expert-parallel-comm": _left(
        0, "EP's all-to-all beside another micro-batch's compute: the plan's time does not overlap it"
    ),
    "--delay-wgrad-compute": _left(0, "weight gradients later (zero-bubble style): not in the plan's time"),
    "--defer-embedding-wgrad-compute": _left(0, "the embedding's weight gradient deferred: not in the plan's time"),
    "--mtp-num-layers": _left(1, "multi-token prediction layers: their weights and work are not counted"),
    # the layers on pipeline stages (megatron/pipeline.py reads them into layout/stages.py's rule).
    # TransformerConfig's num_layers_in_first/last_pipeline_stage have no flags of their own: arguments.py
    # leaves them out of its parser and sets them from the two --decoder-... flags
    "--decoder-first-pipeline-num-layers": _used(
        1, "layers on the first pipeline stage (the rest split evenly over the middle stages)"
    ),
    "--decoder-last-pipeline-num-layers": _used(
        1, "layers on the last pipeline stage (the rest split evenly over the middle stages)"
    ),
    "--account-for-embedding-in-pipeline-split": _used(0, "the embedding takes a layer's place on the first stage"),
    "--account-for-loss-in-pipeline-split": _used(0, "the loss takes a layer's place on the last stage"),
    "--pipeline-model-parallel-layout": _used(
        1, "every pipeline stage's layers, and the virtual stages (its MTP layers are not counted)"
    ),
    "--step-batch-size-schedule": _left(-1, "the batch grows during training: parasim takes --global-batch-size"),
    "--rampup-batch-size": _left(-1, "the batch grows during training: parasim takes --global-batch-size"),
    "--multi-latent-attention": _used(0, "multi-head latent attention: its parameters counted from its ranks"),
    "--q-lora-rank": _used(1, "MLA: the queries' latent rank"),
    "--kv-lora-rank": _used(1, "MLA: the keys' and values' latent rank"),
    "--qk-head-dim": _used(1, "MLA: each head's query/key width without rotary position"),
    "--qk-pos-emb-head-dim": _used(1, "MLA: the rotary part of each head's query/key"),
    "--v-head-dim": _used(1, "MLA: each head's value width"),
    "--hybrid-override-pattern": _left(1, "a hybrid (Mamba) model: parasim models transformer layers only"),
    "--is-hybrid-model": _left(0, "a hybrid (Mamba) model: parasim models transformer layers only"),
    "--encoder-num-layers": _left(1, "an encoder: parasim models a decoder only"),
    "--hierarchical-context-parallel-sizes": _left(-1, "hierarchical CP: parasim's CP is one ring"),
    "--max-position-embeddings": Flag(1, "none"),  # learned positions: a remark of their own (see read.py)
    "--position-embedding-type": Flag(1, "none"),
    "--no-position-embedding": Flag(0, "none"),
}

# Flags that change nothing parasim counts, by how their names start: learning rate, data, logging,
# checkpoints, initialisation, numerics that keep shapes.
NO_EFFECT_PREFIXES = (
    "--lr",
    "--min-lr",
    "--decoupled-",
    "--adam-",
    "--weight-decay",
    "--clip-grad",
    "--init-method",
    "--seed",
    "--train-",
    "--data-",
    "--split",
    "--vocab-file",
    "--merge-file",
    "--tokenizer-",
    "--tiktoken-",
    "--mock-data",
    "--num-workers",
    "--dataloader-",
    "--no-mmap-bin-files",
    "--no-create-attention-mask",
    "--save",
    "--load",
    "--no-load-",
    "--no-save-",
    "--ckpt-",
    "--dist-ckpt-",
    "--auto-detect-ckpt",
    "--finetune",
    "--log",
    "--eval-",
    "--tensorboard-",
    "--wandb-",
    "--timing-",
    "--profile",
    "--exit-",
    "--distributed-timeout",
    "--distributed-backend",
    "--manual-gc",
    "--empty-unused-memory",
    "--use-mcore-models",
    "--use-legacy-models",
    "--transformer-impl",
    "--spec",
    "--rotary-",
    "--use-rotary",
    "--mscale",
    "--norm-epsilon",
    "--apply-layernorm-1p",
    "--qk-layernorm",
    "--add-qkv-bias",
    "--attention-softmax-in-fp32",
    "--no-masked-softmax-fusion",
    "--no-bias-",
    "--no-rope-fusion",
    "--no-gradient-accumulation-fusion",
    "--calculate-per-token-loss",
    "--moe-aux-loss",
    "--moe-z-loss",
    "--moe-router-load-balancing-type",
    "--moe-router-score-function",
    "--moe-router-pre-softmax",
    "--moe-router-enable-expert-bias",
    "--moe-router-bias-update-rate",
    "--moe-router-dtype",
    "--moe-router-topk-scaling-factor",
    "--moe-router-force-load-balancing",
    "--moe-permute-fusion",
    "--moe-input-jitter",
    "--mtp-loss-scaling-factor",
    "--enable-experimental",
    "--no-check-for-nan",
    "--check-for-nan",
    "--rerun-",
    "--init-model-with-meta-device",
    "--fsdp-double-buffer",
    "--use-nccl-ub",
    "--deterministic-mode",
    "--num-dataset-builder-threads",
    "--object-storage-",
    "--use-checkpoint-",
    "--no-persist-layer-norm",
    "--hidden-dropout",
    "--attention-dropout",
    "--use-cpu-initialization",
    "--override-opt-param-scheduler",
    "--use-checkpoint-opt_param-scheduler",
    "--optimizer",
    "--sgd-",
    "--loss-scale",
    "--initial-loss-scale",
    "--min-loss-scale",
    "--loss-scale-window",
    "--hysteresis",
    "--bias-",
    "--no-async-tensor-model-parallel-allreduce",
    "--microbatch-group-size-per-vp-stage",
    "--fp8-amax",
    "--fp8-margin",
    "--fp8-interval",
    "--fp8-wgrad",
    "--ddp-",
    "--bucket-size",
    "--no-align-",
    "--align-",
)


def flag_of(name: str) -> Flag | None:
    """The table's entry for `name`, a no-effect entry for a name with a no-effect prefix, else None."""
    if name in FLAGS:
        return FLAGS[name]
    if name.startswith(NO_EFFECT_PREFIXES):
        return Flag(-1, "none")
    return None
