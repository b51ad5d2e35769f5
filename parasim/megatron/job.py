"""A Megatron-LM job as parasim sees it: its model, layout and step, with every flag accounted for.

`read_job(path)` reads a launch script or a file of flags (megatron/script.py), goes through the flags
with the table (megatron/flags.py) and returns a Job: what each flag it used gave, the flags that change
memory, traffic or time which parasim leaves out (one line each), what contradicts itself (a world that
the layout does not divide, a batch that does not divide into micro-batches), and what it could not read.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from math import lcm
from typing import Any

from ..errors import UsageError
from ..layout import Layout, ModelSpec
from ..layout.mesh import CP_COMMS
from ..limits import MAX_SIZE, brief
from ..layout.precision import precision as precision_of
from .flags import (
    DEFAULT_DIVISIBLE_BY,
    DEFAULT_DROPOUT,
    DEFAULT_FP8_RECIPE,
    DEFAULT_TOPK,
    FLAGS,
    FP8_FORMAT,
    MLA_DEFAULTS,
    MLA_FIELDS,
    PRECISION_FLAGS,
    SHARDING,
    TOKENIZERS,
    flag_of,
)
from . import pipeline
from .script import Script, read_file, read_script

ATTENTION_FLASH = {"auto": True, "flash": True, "fused": True, "unfused": False, "local": False}
NORMS = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}
# the torchrun (or torch.distributed.launch) flags that size the world
NPROC = ("--nproc_per_node", "--nproc-per-node")
NNODES = ("--nnodes",)
# srun's, when it starts the training program itself (in front of torchrun it starts the torchruns)
SRUN_NODES = ("-N", "--nodes")
SRUN_PER_NODE = ("--ntasks-per-node",)
SRUN_TASKS = ("-n", "--ntasks")
PATTERN_CHARS = 1_000  # --moe-layer-freq as a pattern: ([0]*3+[1]*58) is 14 characters, every layer of a deep model
# written out a few hundred; Python's parser, which reads it, recurses once a sign and runs out of memory near 6,000
PATTERN_LAYERS = 10_000  # layers a --moe-layer-freq pattern may describe: the deepest models have a few hundred
SHOWN = 40  # characters of a value a message shows (a value may be as long as the whole script)


@dataclass
class Job:
    """What a Megatron job runs, as parasim reads it."""

    path: str
    script: Script
    given: dict[str, list[str]] = field(default_factory=dict)  # flag -> its words, as given (the last wins)
    used: list[tuple[str, str]] = field(default_factory=list)  # (flag with its value, what parasim takes)
    unmodelled: list[str] = field(default_factory=list)  # one line each
    no_effect: list[str] = field(default_factory=list)  # flags that change nothing parasim counts
    unknown: list[str] = field(default_factory=list)  # flags not in parasim's table
    read: set[str] = field(default_factory=set)  # flags already accounted for (used, or named as left out)
    left: set[str] = field(default_factory=set)  # flags named as left out (what `unmodelled` says of them)
    contradictions: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)  # ModelSpec fields the flags give
    layout: dict[str, Any] = field(default_factory=dict)  # tp, cp, pp, ep, etp, sp, zero, order
    step: dict[str, Any] = field(default_factory=dict)  # micro_batch, global_batch, recompute, flash, dropout, chunks
    seq: int | None = None
    overlap: list[str] = field(default_factory=list)
    launched: int | None = None  # processes the launcher starts (nproc x nnodes), when it says
    gpus_per_node: int | None = None
    world: int | None = None  # the world parasim takes (launched, or the layout's least when they disagree)
    started_by: str = "torchrun"  # what launches the processes: torchrun, or srun in front of the program

    # -- what a command takes from it ------------------------------------------------------------------
    def model_spec(self, tp: int | None = None, **given: Any) -> ModelSpec:
        """The job's model: `given` sizes (a command's own flags) in place of the job's; a vocabulary from the
        job is padded as Megatron pads it for TP `tp` (default: the job's), a given one is taken as it is."""
        fields_ = {k: v for k, v in self.model.items() if k != "vocab_padding"}
        fields_.update({k: v for k, v in given.items() if v is not None})
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if fields_.get(k) is None]
        if missing:
            flag = {
                "layers": "--num-layers",
                "hidden": "--hidden-size",
                "heads": "--num-attention-heads",
                "vocab": "--vocab-size (or a --tokenizer-type parasim knows)",
            }
            raise UsageError(
                f"{self.path}: the job gives no {', '.join(flag[k] for k in missing)}: give "
                f"{' '.join('--' + k + ' N' for k in missing)}"
            )
        if given.get("vocab") is None:
            fields_["vocab"] = padded_vocab(fields_["vocab"], self.model["vocab_padding"], tp or self.layout["tp"])
        name = self.script.path.rsplit("/", 1)[-1]
        return ModelSpec(name=f"{name} (Megatron-LM flags)", **fields_)

    def to_dict(self) -> dict[str, Any]:
        s = self.script
        return {
            "path": self.path,
            "launch": {
                "line": s.line,
                "launcher": s.launcher,
                "program": s.program,
                "prefixes": s.prefixes,
                "environment": s.environment,
            },
            "used": [{"flag": f, "means": m} for f, m in self.used],
            "unmodelled": self.unmodelled,
            "contradictions": self.contradictions,
            "no_effect": self.no_effect,
            "unknown": self.unknown,
            "not_read": s.notes,
            "from_outside": s.outside_read,
            "launched": self.launched,
            "world": self.world,
            "gpus_per_node": self.gpus_per_node,
            "layout": self.layout,
            "step": self.step,
            "seq": self.seq,
            "overlap": self.overlap,
        }


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's padded vocabulary: up to a multiple of --make-vocab-size-divisible-by x TP, so that each TP
    rank's slice of the embedding is equal (megatron/training/vocab_utils.py)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def read_job(path: str, text: str | None = None, outside: dict[str, str] | None = None) -> Job:
    """The job in the launch script or flags file at `path` (or in `text`, named `path`), with the variables
    `outside` set before it runs."""
    script = read_file(path, outside) if text is None else read_script(text, path, outside)
    job = Job(path, script)
    job.given = _split_flags(script.flags, path)
    _launch(job)
    _model(job)
    _layout(job)
    _step(job)
    _rest(job)
    _world(job)
    return job


def _split_flags(words: list[str], path: str) -> dict[str, list[str]]:
    """Flag -> its values, by the table's count of values (a flag not in it takes the words up to the next
    flag). A value may follow `=`. Given twice, the last wins (argparse's rule)."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            i += 1  # a stray word: argparse would refuse it; the flag before it says what it is
            continue
        name, eq, inline = w.partition("=")
        entry = flag_of(name)
        takes = entry.takes if entry is not None else -1
        if eq:
            values = [inline]
            i += 1
        elif takes == 0:
            values = []
            i += 1
        else:
            j = i + 1
            while j < len(words) and not words[j].startswith("--") and (takes == -1 or j - i <= takes):
                j += 1
            values, i = words[i + 1 : j], j
        out[name] = values
    return out


def _int(job: Job, flag: str, least: int = 1) -> int | None:
    values = job.given.get(flag)
    if values is None:
        return None
    if not values or not re.fullmatch(r"[0-9]{1,15}", values[0]):
        got = brief(values[0]) if values else "nothing (is the variable it reads set?)"
        raise UsageError(f"{job.path}: {flag} expects a whole number, got {got}")
    v = int(values[0])
    if v < least:
        raise UsageError(f"{job.path}: {flag} must be at least {least}, got {v}")
    return v


def _text(job: Job, flag: str) -> str | None:
    values = job.given.get(flag)
    if values is None:
        return None
    if not values:
        raise UsageError(f"{job.path}: {flag} has no value (is the variable it reads set?)")
    return values[0]


def _use(job: Job, flag: str, means: str | None = None) -> None:
    """`flag` (with its values, as given) used, meaning `means` (default: the table's words)."""
    shown = " ".join([flag] + job.given.get(flag, []))
    job.used.append((shown, means if means is not None else FLAGS[flag].means))
    job.read.add(flag)


def _leave(job: Job, line: str, *flags: str) -> None:
    """One line for what `flags` change that parasim does not model."""
    job.unmodelled.append(line)
    job.read.update(flags)
    job.left.update(flags)


def _launch(job: Job) -> None:
    """The processes the launcher starts: torchrun's --nproc_per_node x --nnodes, or srun's tasks."""
    launcher = job.script.launcher
    if not launcher:
        return
    opts: dict[str, str] = {}
    for i, w in enumerate(launcher):
        name, eq, inline = w.partition("=")
        if name.startswith("--"):
            opts[name] = inline if eq else (launcher[i + 1] if i + 1 < len(launcher) else "")
    runs_torch = launcher[0].rsplit("/", 1)[-1] == "torchrun" or any(
        w in ("torch.distributed.run", "torch.distributed.launch") for w in launcher
    )
    nproc_flag = next((k for k in NPROC if k in opts), NPROC[0])
    nproc_text = opts.get(nproc_flag)
    nnodes_text = next((opts[k] for k in NNODES if k in opts), "1")
    srun = job.script.prefix_options("srun")
    if not runs_torch and srun is not None:
        _srun(job, srun)
        return
    if not runs_torch:
        job.contradictions.append(
            f"launched by {launcher[0]}, not torchrun: parasim cannot tell how many processes "
            "it starts: it takes the layout's least"
        )
        return
    nproc = _count(job, nproc_flag, nproc_text)
    if nproc is None:  # auto, gpu, an unset variable: what torchrun finds where it runs
        job.contradictions.append(
            f"torchrun's --nproc_per_node is {brief(nproc_text)}: parasim takes 1 process per node"
        )
        nproc = 1
    if ":" in nnodes_text:  # elastic: MIN:MAX nodes
        nnodes_text = nnodes_text.split(":")[-1]
        job.unmodelled.append(
            f"torchrun --nnodes {opts['--nnodes'][:SHOWN]}: elastic; parasim takes the most, {nnodes_text[:SHOWN]}"
        )
    nnodes = _count(job, "--nnodes", nnodes_text)
    if nnodes is None:
        job.contradictions.append(f"torchrun's --nnodes is {brief(nnodes_text)}: parasim takes 1 node")
        nnodes = 1
    job.gpus_per_node, job.launched = nproc, nproc * nnodes


def _srun(job: Job, opts: dict[str, str]) -> None:
    """srun starting the program itself: -n/--ntasks processes, else --ntasks-per-node (1) on each of
    -N/--nodes (1); none of them given, its allocation decides (SLURM's variables, unknown here)."""
    job.started_by = "srun"
    given = {flags: next((k for k in flags if k in opts), None) for flags in (SRUN_NODES, SRUN_PER_NODE, SRUN_TASKS)}
    if not any(given.values()):
        job.contradictions.append(
            "srun is given no -N, -n or --ntasks-per-node: its allocation decides how many "
            "processes it starts: parasim takes the layout's least"
        )
        return
    counts: dict[tuple[str, ...], int | None] = {}
    for flags, flag in given.items():
        counts[flags] = None if flag is None else _count(job, flag, opts[flag], "srun")
        if flag is not None and counts[flags] is None:  # an unset variable, a range: what SLURM gives
            job.contradictions.append(f"srun's {flag} is {brief(opts[flag])}: parasim takes 1")
            counts[flags] = 1
    nodes, per_node, tasks = counts[SRUN_NODES] or 1, counts[SRUN_PER_NODE], counts[SRUN_TASKS]
    if tasks is not None:  # spread over the nodes, the first ones taking one more when they do not divide it
        job.launched, job.gpus_per_node = tasks, per_node or -(-tasks // nodes)
    else:
        job.launched, job.gpus_per_node = nodes * (per_node or 1), per_node or 1


def _count(job: Job, flag: str, text: str | None, by: str = "torchrun") -> int | None:
    """The launcher's count `text` (of processes per node, or of nodes) as a number from 1 to MAX_SIZE; None
    when it is not written in digits (auto, an unset variable). Zero launches nothing, and the world is divided
    by it."""
    if text is None or re.fullmatch(r"-?[0-9]+", text) is None:
        return None
    where = f"{job.path}: line {job.script.line}: {by} {flag} {text[:SHOWN]}"
    if len(text) > 14 or int(text) > MAX_SIZE:  # 14: a sign and 13 digits, past MAX_SIZE (int() of many is slow)
        raise UsageError(f"{where}: more than {MAX_SIZE:.0e}, the limit on any one size (far beyond every cluster)")
    if int(text) < 1:
        raise UsageError(f"{where} launches no process: it takes a count of at least 1")
    return int(text)


def _model(job: Job) -> None:
    g, m = job.given, job.model
    for flag, key in (
        ("--num-layers", "layers"),
        ("--hidden-size", "hidden"),
        ("--num-attention-heads", "heads"),
        ("--ffn-hidden-size", "ffn"),
        ("--seq-length", None),
    ):
        v = _int(job, flag)
        if v is None:
            continue
        _use(job, flag)
        if key is None:
            job.seq = v
        else:
            m[key] = v
    m["gated"] = "--swiglu" in g
    if m["gated"]:
        _use(job, "--swiglu")
        if "ffn" not in m and "hidden" in m:  # Megatron's default width for a gated MLP
            m["ffn"] = int((4 * m["hidden"] * 2 / 3) / 64) * 64
    if "--group-query-attention" in g:
        _use(job, "--group-query-attention")
        groups = _int(job, "--num-query-groups")
        if groups is None:
            raise UsageError(f"{job.path}: --group-query-attention without --num-query-groups")
        _use(job, "--num-query-groups")
        m["kv_heads"] = groups
    elif "--num-query-groups" in g:
        _use(
            job,
            "--num-query-groups",
            "read only with --group-query-attention (as Megatron does): every head has its own K, V",
        )
    kv_channels = _int(job, "--kv-channels")
    latent = "--multi-latent-attention" in g
    if latent:
        _latent(job)
    if kv_channels is not None and latent:
        _use(job, "--kv-channels", "not read: MLA's heads are sized by its own flags")
    elif kv_channels is not None:
        if "hidden" in m and "heads" in m and kv_channels * m["heads"] == m["hidden"]:
            _use(job, "--kv-channels", "the size of one head (hidden / heads)")
        else:
            _use(job, "--kv-channels", "the size of one head (not hidden / heads: attention's weights counted with it)")
            m["head_size"] = kv_channels
            _leave(job, f"--kv-channels {kv_channels}: the activations keep attention hidden-wide", "--kv-channels")
    vocab = _int(job, "--vocab-size")
    if vocab is not None:
        _use(job, "--vocab-size")
        m["vocab"] = vocab
    elif (_text(job, "--tokenizer-type") if g.get("--tokenizer-type") else None) in TOKENIZERS:
        kind = g["--tokenizer-type"][0]
        m["vocab"] = TOKENIZERS[kind]
        _use(job, "--tokenizer-type", f"its vocabulary: {m['vocab']:,} tokens")
    elif "--vocab-file" in g and "--merge-file" in g and "--tokenizer-type" not in g:
        # a BPE vocabulary and merges with no tokenizer named: Megatron's GPT examples, GPT-2's tokenizer
        m["vocab"] = TOKENIZERS["GPT2BPETokenizer"]
        _use(job, "--vocab-file", f"with --merge-file: GPT-2's BPE vocabulary, {m['vocab']:,} tokens")
    divisible = _int(job, "--make-vocab-size-divisible-by")
    if divisible is not None:
        _use(job, "--make-vocab-size-divisible-by")
    m["vocab_padding"] = divisible or DEFAULT_DIVISIBLE_BY
    if "--disable-bias-linear" in g:
        _use(job, "--disable-bias-linear")
        m["bias"] = False
    norm = _text(job, "--normalization")
    if norm is not None:
        if norm.lower() not in NORMS:
            raise UsageError(f"{job.path}: --normalization {brief(norm)}: Megatron takes LayerNorm or RMSNorm")
        _use(job, "--normalization")
        m["norm"] = NORMS[norm.lower()]
    m["tied_embeddings"] = "--untie-embeddings-and-output-weights" not in g
    if not m["tied_embeddings"]:
        _use(job, "--untie-embeddings-and-output-weights")
    _experts(job)
    _positions(job)
    _dropout(job)


def _latent(job: Job) -> None:
    """--multi-latent-attention's ranks and head sizes, Megatron's defaults where a flag is absent."""
    _use(job, "--multi-latent-attention")
    for flag, key in MLA_FIELDS.items():
        v = _int(job, flag)
        if v is not None:
            _use(job, flag)
        else:
            v = MLA_DEFAULTS[flag]
            if v is not None:
                job.used.append((f"(no {flag})", f"{FLAGS[flag].means}: Megatron's default, {v}"))
        if v is not None:
            job.model[key] = v
    job.unmodelled.append(
        "--multi-latent-attention: parameters counted from its ranks; the activations, "
        "attention's time and CP's traffic are those of plain multi-head attention"
    )


def _experts(job: Job) -> None:
    m = job.model
    experts = _int(job, "--num-experts")
    if experts is None:
        return
    _use(job, "--num-experts")
    m["experts"] = experts
    topk = _int(job, "--moe-router-topk")
    if topk is None:
        job.used.append(("(no --moe-router-topk)", f"experts per token: Megatron's default, {DEFAULT_TOPK}"))
    else:
        _use(job, "--moe-router-topk")
    m["top_k"] = topk or DEFAULT_TOPK
    width = _int(job, "--moe-ffn-hidden-size")
    if width is not None:
        _use(job, "--moe-ffn-hidden-size")
        m["expert_ffn"] = width
    shared = _int(job, "--moe-shared-expert-intermediate-size")
    if shared is not None:
        unit = width or m.get("ffn") or 4 * m.get("hidden", 0)
        if unit and shared % unit == 0:
            _use(job, "--moe-shared-expert-intermediate-size", f"{shared // unit} shared expert(s) of width {unit}")
            m["shared_experts"] = shared // unit
        else:
            _use(job, "--moe-shared-expert-intermediate-size", f"one shared expert of width {shared}")
            m["shared_experts"], m["shared_expert_ffn"] = 1, shared
    freq = _text(job, "--moe-layer-freq")
    if freq is not None:
        dense = _dense_first(job, freq, m.get("layers"))
        if dense is None:
            _leave(
                job,
                f"--moe-layer-freq {freq}: MoE layers between dense ones; parasim models dense layers "
                "first, then MoE layers",
                "--moe-layer-freq",
            )
        else:
            _use(job, "--moe-layer-freq", f"the first {dense} layer(s) dense, the rest MoE")
            m["dense_layers"] = dense
    groups, kept = _int(job, "--moe-router-num-groups"), _int(job, "--moe-router-group-topk")
    if groups is not None and kept is not None:
        _use(job, "--moe-router-num-groups", f"{groups} groups of experts")
        _use(job, "--moe-router-group-topk", f"a token's experts from {kept} of them")
        m["expert_groups"], m["groups_kept"] = groups, kept
    elif groups is not None or kept is not None:
        _leave(
            job,
            "group-limited routing needs both --moe-router-num-groups and --moe-router-group-topk: the "
            "one given is left out",
            "--moe-router-num-groups",
            "--moe-router-group-topk",
        )
    dispatcher = _text(job, "--moe-token-dispatcher-type")
    backend = _text(job, "--moe-flex-dispatcher-backend")
    if "--moe-enable-deepep" in job.given:  # Megatron-Core refuses it beside another dispatcher or backend
        _use(job, "--moe-enable-deepep")
        if dispatcher != "flex" or backend not in (None, "deepep"):
            job.contradictions.append(
                "--moe-enable-deepep needs --moe-token-dispatcher-type flex and no other "
                "backend (Megatron-Core refuses it): parasim takes the flex dispatcher with "
                "deepep"
            )
            dispatcher = "flex"
        backend = "deepep"
    if dispatcher == "alltoall":
        _use(job, "--moe-token-dispatcher-type")
        job.step["dispatcher"] = "alltoall"
    elif dispatcher == "flex" and (backend or "deepep") in ("deepep", "hybridep"):
        job.step["dispatcher"] = backend or "deepep"  # Megatron-Core's default backend: deepep
        _use(
            job,
            "--moe-token-dispatcher-type",
            f"the flex dispatcher: {job.step['dispatcher']}, a token once to each GPU and node that needs it",
        )
        if "--moe-flex-dispatcher-backend" in job.given:
            _use(job, "--moe-flex-dispatcher-backend")
    elif dispatcher == "flex":
        _leave(
            job,
            f"--moe-flex-dispatcher-backend {brief(backend or '')}: parasim times deepep and hybridep",
            "--moe-token-dispatcher-type",
            "--moe-flex-dispatcher-backend",
        )
    else:
        shown = (
            f"--moe-token-dispatcher-type {dispatcher}"
            if dispatcher
            else "(no --moe-token-dispatcher-type: Megatron's default, allgather)"
        )
        _leave(
            job,
            f"{shown}: tokens reach their experts another way than parasim's all-to-all, with other traffic",
            "--moe-token-dispatcher-type",
        )


def _dense_first(job: Job, text: str, layers: int | None) -> int | None:
    """`--moe-layer-freq`: an int N (every N-th layer MoE; 1 = all) or a pattern such as ([0]*3+[1]*58).
    The number of leading dense layers when the pattern is dense layers then MoE layers, else None."""
    text = text.strip()
    if text.isdigit():
        return 0 if text.lstrip("0") == "1" else None
    if len(text) > PATTERN_CHARS:
        raise UsageError(
            f"{job.path}: --moe-layer-freq is {len(text):,} characters long, more than the limit of "
            f"{PATTERN_CHARS:,} (a layer pattern such as ([0]*3+[1]*58) is a few dozen)"
        )
    try:
        pattern = _pattern(ast.parse(text.strip("'\""), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None
    except _TooManyLayers:
        raise UsageError(
            f"{job.path}: --moe-layer-freq {text[:SHOWN]} describes more than {PATTERN_LAYERS:,} "
            "layers, the limit (the deepest models have a few hundred)"
        ) from None
    dense = len(pattern) - len("".join(str(x) for x in pattern).lstrip("0"))
    if any(x != 1 for x in pattern[dense:]) or (layers is not None and len(pattern) != layers):
        return None
    return dense


class _TooManyLayers(Exception):
    """A --moe-layer-freq pattern of more than PATTERN_LAYERS layers (([0]*100000)*100000 would be 10**10)."""


def _pattern(node: ast.AST) -> list[int]:
    """The layers of a pattern, each list's length checked against PATTERN_LAYERS before it is built."""
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and e.value in (0, 1) for e in node.elts):
        return [int(e.value) for e in node.elts]  # type: ignore[attr-defined]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pattern(node.left), _pattern(node.right)
        if len(left) + len(right) > PATTERN_LAYERS:
            raise _TooManyLayers()
        return left + right
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and isinstance(node.right, ast.Constant)
        and isinstance(node.right.value, int)
        and not isinstance(node.right.value, bool)
        and node.right.value >= 0
    ):
        left = _pattern(node.left)
        if len(left) * node.right.value > PATTERN_LAYERS:
            raise _TooManyLayers()
        return left * node.right.value
    raise ValueError("not a layer pattern")


def _positions(job: Job) -> None:
    g = job.given
    kind = _text(job, "--position-embedding-type") or "learned_absolute"
    if "--position-embedding-type" in g:
        _use(job, "--position-embedding-type", f"{kind}" + (": no weights" if kind != "learned_absolute" else ""))
    if kind == "learned_absolute" and "--no-position-embedding" not in g:
        most = _int(job, "--max-position-embeddings")
        size = f"{most:,} x hidden" if most else "--max-position-embeddings x hidden"
        job.unmodelled.append(
            f"learned position embeddings (Megatron's default): {size} weights parasim does not count"
        )
    elif "--max-position-embeddings" in g:
        _use(job, "--max-position-embeddings", "no weights (the positions are rotary)")


def _dropout(job: Job) -> None:
    rates = []
    for flag in ("--hidden-dropout", "--attention-dropout"):
        text = _text(job, flag)
        try:
            rates.append(DEFAULT_DROPOUT if text is None else float(text))
        except ValueError:
            raise UsageError(f"{job.path}: {flag} expects a number, got {brief(text)}") from None
        if text is not None:
            _use(job, flag)
    job.step["dropout"] = any(r > 0 for r in rates)


def _layout(job: Job) -> None:
    g, y = job.given, job.layout
    for flag, axis in (
        ("--tensor-model-parallel-size", "tp"),
        ("--pipeline-model-parallel-size", "pp"),
        ("--context-parallel-size", "cp"),
        ("--expert-model-parallel-size", "ep"),
        ("--expert-tensor-parallel-size", "etp"),
    ):
        v = _int(job, flag)
        if v is not None:
            _use(job, flag)
            y[axis] = v
    for axis in ("tp", "pp", "cp", "ep"):
        y.setdefault(axis, 1)
    if "etp" not in y:  # Megatron's default expert TP is the dense TP
        y["etp"] = y["tp"]
    y["sp"] = "--sequence-parallel" in g and y["tp"] > 1
    if "--sequence-parallel" in g:
        _use(job, "--sequence-parallel", "SP" if y["sp"] else "ignored: TP is 1, and Megatron turns SP off")
    if "--use-tp-pp-dp-mapping" in g:
        _use(job, "--use-tp-pp-dp-mapping")
        y["order"] = "tp-cp-ep-pp-dp"
    zero = 0
    if "--use-distributed-optimizer" in g:
        _use(job, "--use-distributed-optimizer")
        zero = 1
    if "--use-megatron-fsdp" in g:
        strategy = _text(job, "--data-parallel-sharding-strategy") or "optim_grads_params"
        if strategy not in SHARDING:
            raise UsageError(
                f"{job.path}: --data-parallel-sharding-strategy {brief(strategy)}: one of {', '.join(SHARDING)}"
            )
        _use(job, "--use-megatron-fsdp", f"Megatron-FSDP, sharding {strategy}: ZeRO-{SHARDING[strategy]}")
        if "--data-parallel-sharding-strategy" in g:
            _use(job, "--data-parallel-sharding-strategy")
        zero = SHARDING[strategy]
    if "--use-torch-fsdp2" in g:
        _use(job, "--use-torch-fsdp2")
        zero = 3
    y["zero"] = zero
    if zero == 0:
        job.used.append(("(no --use-distributed-optimizer)", "ZeRO-0: every DP rank keeps the whole optimizer state"))
    chunks = None
    per_stage = _int(job, "--num-layers-per-virtual-pipeline-stage")
    if per_stage is not None:
        layers = job.model.get("layers")
        if layers and layers % (y["pp"] * per_stage) == 0:
            chunks = layers // (y["pp"] * per_stage)
            _use(job, "--num-layers-per-virtual-pipeline-stage", f"interleaved 1F1B: {chunks} model chunks per GPU")
        else:
            job.contradictions.append(
                f"--num-layers-per-virtual-pipeline-stage {per_stage}: {layers} layers over "
                f"PP {y['pp']} do not make whole chunks of {per_stage}"
            )
    v = _int(job, "--num-virtual-stages-per-pipeline-rank")
    if v is not None:
        _use(job, "--num-virtual-stages-per-pipeline-rank")
        chunks = v
    job.step["chunks"] = _pipeline(job, chunks) or chunks or 1
    for flag, name in (
        ("--overlap-grad-reduce", "grad-reduce"),
        ("--overlap-param-gather", "prefetch"),
        ("--tp-comm-overlap", "tp"),
        ("--overlap-p2p-communication", "p2p"),
    ):
        if flag in g:
            _use(job, flag)
            job.overlap.append(name)
    cp_type = _text(job, "--cp-comm-type") or "p2p"
    if cp_type in CP_COMMS:  # the K/V ring, or K and V all-gathered (nn/gathered_attention.py)
        y["cp_comm"] = cp_type
        if "--cp-comm-type" in g:
            _use(job, "--cp-comm-type")
    else:
        _leave(
            job,
            f"--cp-comm-type {cp_type}: CP by another exchange than the two parasim runs ({' and '.join(CP_COMMS)})",
            "--cp-comm-type",
        )
    if y["cp"] > 1 and cp_type == "p2p":  # TransformerEngine's ring runs each K/V exchange beside attention
        job.overlap.append("cp")


def _pipeline(job: Job, chunks: int | None) -> int | None:
    """The layers on pipeline stages (megatron/pipeline.py: Megatron's uneven first and last stage, the
    embedding and loss counted in the split, or a layout of every stage) into the model's stage rule; the
    model chunks per GPU a layout states (None: the other flags'). Left out: MTP layers a layout places."""
    g = job.given
    given = {
        pipeline.FIRST: _int(job, pipeline.FIRST),
        pipeline.LAST: _int(job, pipeline.LAST),
        pipeline.EMBEDDING: pipeline.EMBEDDING in g,
        pipeline.LOSS: pipeline.LOSS in g,
        pipeline.LAYOUT: _text(job, pipeline.LAYOUT),
        pipeline.VIRTUAL: g.get(pipeline.VIRTUAL),
        pipeline.PER_VIRTUAL: g.get(pipeline.PER_VIRTUAL),
    }
    rule, virtual = pipeline.split_of(job.model.get("layers"), job.layout["pp"], given, chunks)
    for flag in (
        f for f in (pipeline.FIRST, pipeline.LAST, pipeline.EMBEDDING, pipeline.LOSS, pipeline.LAYOUT) if f in g
    ):
        _use(job, flag)
    if rule.given:
        job.model["stages"] = rule
    return virtual


def _step(job: Job) -> None:
    g, s = job.given, job.step
    micro = _int(job, "--micro-batch-size")
    if micro is not None:
        _use(job, "--micro-batch-size")
    s["micro_batch"] = micro or 1
    batch = _int(job, "--global-batch-size")
    if batch is not None:
        _use(job, "--global-batch-size")
        s["global_batch"] = batch
    granularity = _text(job, "--recompute-granularity")
    if "--recompute-activations" in g:
        _use(job, "--recompute-activations")
        granularity = granularity or "selective"
    if granularity is not None and granularity not in ("full", "selective"):
        raise UsageError(f"{job.path}: --recompute-granularity {brief(granularity)}: full or selective")
    if "--recompute-granularity" in g:
        _use(job, "--recompute-granularity")
    s["recompute"] = granularity or "none"
    method, layers = _text(job, "--recompute-method"), _int(job, "--recompute-num-layers")
    if granularity == "full" and (method not in (None, "uniform") or layers not in (None, 1)):
        _leave(
            job,
            f"full recomputation by {method or 'uniform'} over {layers or 1} layer(s): parasim's keeps "
            "every layer's input and re-runs one layer at a time (uniform, 1)",
            "--recompute-method",
            "--recompute-num-layers",
        )
    else:
        for flag in ("--recompute-method", "--recompute-num-layers"):
            if flag in g:
                _use(job, flag)
    backend = _text(job, "--attention-backend")
    flash = True
    if backend is not None:
        if backend not in ATTENTION_FLASH:
            raise UsageError(f"{job.path}: --attention-backend {brief(backend)}: one of {', '.join(ATTENTION_FLASH)}")
        flash = ATTENTION_FLASH[backend]
        _use(
            job,
            "--attention-backend",
            "FlashAttention: the scores are not kept" if flash else "the whole scores kept (no FlashAttention)",
        )
    if "--use-flash-attn" in g:
        _use(job, "--use-flash-attn")
    s["flash"] = flash
    s["precision"] = _precision(job)


def _precision(job: Job) -> str:
    """The job's entry of layout/precision.py: the one whose Megatron-LM flags (flags.PRECISION_FLAGS) the job
    gives. --accumulate-allreduce-grads-in-fp32 with --bf16 is its default (FP32 gradients already)."""
    g = job.given
    if "--bf16" in g and "--fp16" in g:
        raise UsageError(f"{job.path}: both --bf16 and --fp16 are given; Megatron-LM refuses that: keep one")
    given = {f for f in ("--bf16", "--fp16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32") if f in g}
    if given >= {"--bf16", "--accumulate-allreduce-grads-in-fp32"} and "--grad-reduce-in-bf16" not in given:
        given.discard("--accumulate-allreduce-grads-in-fp32")
        _use(job, "--accumulate-allreduce-grads-in-fp32")  # the default under --bf16
    if "--grad-reduce-in-bf16" in given and "--bf16" not in given:  # Megatron reads it only with --bf16
        given.discard("--grad-reduce-in-bf16")
    if "--accumulate-allreduce-grads-in-fp32" in given and not given & {"--bf16", "--fp16"}:
        given.discard("--accumulate-allreduce-grads-in-fp32")  # FP32 training accumulates in FP32 already
    name = next((n for n, flags in PRECISION_FLAGS.items() if set(flags) == given), None)
    if name is None:  # --bf16 with both --grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32
        raise UsageError(
            f"{job.path}: {' and '.join(sorted(given))} contradict each other: --grad-reduce-in-bf16 "
            "reduces BF16 gradients, --accumulate-allreduce-grads-in-fp32 FP32 ones"
        )
    for f in PRECISION_FLAGS[name]:
        _use(job, f)
    return _fp8(job, name)


def _fp8(job: Job, name: str) -> str:
    """With --fp8-format, the FP8 entry of the job's --fp8-recipe on top of its BF16 setting (flags.FP8_FORMAT's
    recipes); a recipe parasim has no cast cost for, or FP8 without --bf16, is left out in one line (the products
    timed as `name`'s)."""
    g = job.given
    if "--fp8-format" not in g:
        return name
    recipe = (g.get("--fp8-recipe") or [DEFAULT_FP8_RECIPE])[0]
    fp8 = f"{name}-fp8-{recipe}"
    shown = " ".join(["--fp8-format"] + g["--fp8-format"] + (["--fp8-recipe", recipe] if "--fp8-recipe" in g else []))
    if recipe not in FP8_FORMAT or fp8 not in PRECISION_FLAGS:
        why = (
            f"parasim has no cost for the {recipe} recipe's casts"
            if recipe not in FP8_FORMAT
            else "FP8 linears on top of another precision than --bf16"
        )
        _leave(
            job,
            f"{shown}: {why}; the products are timed in {precision_of(name).short('compute')}",
            "--fp8-format",
            "--fp8-recipe",
        )
        return name
    for f in ("--fp8-format", "--fp8-recipe"):
        if f in g:
            _use(job, f)
    if "--fp8-param-gather" in g:  # the weights kept and all-gathered in FP8
        _use(job, "--fp8-param-gather")
        return f"{fp8}-gather"
    return fp8


def _rest(job: Job) -> None:
    """Every flag not yet accounted for: the table's "not modelled" rows get their line, "no effect" rows
    (and a flag read only with another that is absent, as Megatron reads it) are listed, the rest unknown."""
    for flag, values in job.given.items():
        if flag in job.read:
            continue
        entry = flag_of(flag)
        if entry is None:
            job.unknown.append(flag)
        elif entry.role == "unmodelled":
            _leave(job, f"{' '.join([flag] + values)}: {entry.means}", flag)
        else:
            job.no_effect.append(flag)


def _world(job: Job) -> None:
    """The world: what torchrun launches, checked against what the layout needs (TP x CP x PP per data-parallel
    replica; the experts' ETP x EP dividing each stage's TP x CP x DP); the micro-batches per step."""
    y = job.layout
    tp, cp, pp, ep, etp = y["tp"], y["cp"], y["pp"], y["ep"], y["etp"]
    if not job.model.get("experts") and ep == 1:
        etp = 1  # a dense model: no expert layout to hold
    least = pp * lcm(tp * cp, etp * ep)  # the fewest GPUs that hold the layout
    laid = f"TP {tp} x CP {cp} x PP {pp}" + (f" with EP {ep} x ETP {etp}" if job.model.get("experts") else "")
    if job.launched is None:
        job.world = least
    elif job.launched % least:
        take = least * max(1, job.launched // least)
        nproc, nnodes = job.gpus_per_node, job.launched // (job.gpus_per_node or 1)
        job.contradictions.append(
            f"the script's {job.started_by} launches {job.launched:,} processes ({nproc} per node x {nnodes} node"
            f"{'s' if nnodes != 1 else ''}), but {laid} needs a multiple of {least:,}: parasim takes {take:,} GPUs "
            f"(--gpus N, or --world N on layout and trace, takes another)"
        )
        job.world = take
    else:
        job.world = job.launched
    dp = job.world // (tp * cp * pp)
    batch = job.step.get("global_batch")
    micro = job.step["micro_batch"]
    if batch is not None:
        if batch % (micro * dp):
            job.contradictions.append(
                f"--global-batch-size {batch:,} is not a multiple of --micro-batch-size {micro} "
                f"x DP {dp}: parasim takes {max(1, batch // (micro * dp)):,} micro-batches"
            )
        job.step["microbatches"] = max(1, batch // (micro * dp))


LAYOUT_FIELDS = ("tp", "cp", "pp", "dp", "ep", "etp", "sp", "cp_comm", "zero", "order", "world", "gpus_per_node")


def _degrees(job: Job, override: dict[str, Any]) -> dict[str, Any]:
    """The job's Layout fields (degrees, SP, ZeRO stage, rank order, world, GPUs per node) with `override`'s
    given values (a command's own flags; None: the job's) in their place. DP given without a world makes the
    world follow from it."""
    y = job.layout
    out = dict(
        tp=y["tp"],
        cp=y["cp"],
        pp=y["pp"],
        ep=y["ep"],
        etp=y["etp"],
        sp=y["sp"],
        cp_comm=y.get("cp_comm", CP_COMMS[0]),
        zero=y["zero"],
        order=y.get("order", "tp-cp-ep-dp-pp"),
        world=job.world,
        gpus_per_node=job.gpus_per_node or 8,
    )
    if y.get("dp") is not None and job.world is None:  # a DP the job gives without a world (DeepSpeed's batch)
        out["dp"], out["world"] = y["dp"], None
    given = {k: v for k, v in override.items() if v is not None}
    if "dp" in given and "world" not in given:
        out["world"] = None
    if "world" in given:  # the GPUs given here: DP is what they leave
        out.pop("dp", None)
    return {**out, **given}


def plan_of(job: Job, model: ModelSpec, world: int | None = None, **override: Any) -> Any:
    """The estimator's plan of the job (its degrees, ZeRO stage and step choices) for `model`, on `world` GPUs
    (default: the job's); `override` replaces any plan field (a command's own flags)."""
    from dataclasses import replace
    from ..estimate.memory import Plan

    fields_ = _degrees(job, {"world": world, **{k: v for k, v in override.items() if k in LAYOUT_FIELDS}})
    if not model.experts and fields_["ep"] == 1 and override.get("etp") is None:
        fields_["etp"] = 1  # a dense model has no experts to split
    s = job.step
    choices = dict(
        recompute=s["recompute"],
        flash=s["flash"],
        dropout=s["dropout"],
        micro_batch=s["micro_batch"],
        chunks=s["chunks"],
        precision=s["precision"],
        dispatcher=s.get("dispatcher", "alltoall"),
    )
    # the kernels a job names (another stack's: torchtitan's eager layers, its SDPA attention)
    choices.update({k: s[k] for k in ("fusion", "attention_kernel", "chunked_loss") if k in s})
    choices.update({k: v for k, v in override.items() if k not in LAYOUT_FIELDS and v is not None})
    plan = Plan(**fields_, **choices)
    batch = s.get("global_batch")
    if override.get("microbatches") is None and batch is not None:  # the global batch holds whatever DP is
        plan = replace(plan, microbatches=max(1, batch // (plan.micro_batch * plan.dp)))
    elif override.get("microbatches") is None and s.get("microbatches"):  # a count the job states by itself
        plan = replace(plan, microbatches=s["microbatches"])
    if s.get("micro_from_batch") and override.get("micro_batch") is None and batch is not None:
        # DeepSpeed's file gives the batch and not the micro-batch: it follows from the batch, the accumulation
        # and DP (deepspeed/runtime/config.py, _set_batch_related_parameters)
        acc = s.get("microbatches") or 1
        plan = replace(plan, micro_batch=max(1, batch // (acc * plan.dp)), microbatches=acc)
    return plan.check(model, job.seq)


def layout_of(job: Job, model: ModelSpec | None, **override: Any) -> Layout:
    """The job's Layout on its world, `override`'s given fields (a command's own flags) in place of the job's."""
    return Layout(**_degrees(job, override), model=model)


__all__ = ["Job", "read_job", "plan_of", "layout_of", "padded_vocab"]
