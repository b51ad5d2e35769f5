"""A user's job file read as parasim's model, layout and step, every field accounted for: the shape every
stack's reader returns (`ReadJob`), and the walk that says what happened to each field of a file.

A stack's reader (job/deepspeed.py, job/picotron.py, job/torchtitan.py) holds a table of the fields it knows,
each "used" (the reader reads it and says what it took), "unmodelled" (it changes memory, traffic or time and
parasim leaves it out: the table's words say how) or "no effect" (a learning rate, a log setting). After the
reader has read what it uses, `account` names every other field of the file: the table's line for a field
left out, "no effect" for the rest of the table, and "unknown" for a field the table does not have. Megatron-LM
jobs (megatron/job.py's Job) carry the same attributes, so the commands plan from either alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..layout import ModelSpec
from ..limits import MAX_SIZE, brief

USED, UNMODELLED, NO_EFFECT = "used", "unmodelled", "no effect"
DEPTH = 8  # levels of nesting a job file's fields may have (DeepSpeed's deepest is 3: zero_optimization.offload_param.device)
FIELDS_AT_MOST = 10_000  # fields one job file may hold (the largest real ones have under 100)


@dataclass(frozen=True)
class JobField:
    """One field of a stack's file: its dotted name (`zero_optimization.stage`; `*` stands for any one key, so
    `optimizer.params.*` is every optimizer parameter), what the reader does with it, and for a field left
    out or of no effect, why."""

    name: str
    role: str
    means: str = ""

    def matches(self, dotted: str) -> bool:
        want, got = self.name.split("."), dotted.split(".")
        if want[-1] == "**":  # the field and everything under it
            return got[: len(want) - 1] == want[:-1]
        return len(want) == len(got) and all(w in ("*", g) for w, g in zip(want, got))


@dataclass
class ReadJob:
    """A job file of one stack as parasim reads it (the attributes megatron/job.py's Job has too, so plans are
    made from either by megatron/job.py's plan_of): the model fields it gives (`model`, ModelSpec's names;
    empty where the file names no model), the layout (`layout`: tp, cp, pp, ep, etp, sp, zero, order), the
    step (`step`: micro_batch, global_batch, recompute, flash, dropout, chunks, precision, dispatcher), the
    sequence, the overlaps it turns on and the GPUs it runs on; and what happened to every field."""

    path: str
    format: str  # the registry's name of the stack (job/formats.py)
    title: str  # the stack's file in words: "DeepSpeed config"
    values: dict[str, Any] = field(default_factory=dict)  # dotted field -> its value, every leaf of the file
    used: list[tuple[str, str]] = field(default_factory=list)  # (field with its value, what parasim takes)
    unmodelled: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # what the file leaves open and parasim took, one line each
    read: set[str] = field(default_factory=set)
    model: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None  # a model the file names but does not describe (picotron's HF id)
    layout: dict[str, Any] = field(default_factory=dict)
    step: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None
    overlap: list[str] = field(default_factory=list)
    world: int | None = None
    gpus_per_node: int | None = None
    sets: tuple[str, ...] = ()  # the command line's --job-set NAME=VALUE, each in place of the file's field

    # -- reading -------------------------------------------------------------------------------------------
    def use(self, name: str, means: str) -> Any:
        """The value of field `name` (None where absent), recorded as used with what parasim takes from it."""
        if name not in self.values:
            return None
        self.read.add(name)
        self.used.append((f"{name} {_shown(self.values[name])}", means))
        return self.values[name]

    def size(self, name: str, least: int = 1) -> int | None:
        """The field `name` as a count (None where absent or "auto"); anything else is refused in one line."""
        v = self.values.get(name)
        if v is None or v == "auto":
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # DeepSpeed's files write sizes as 5e7
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MAX_SIZE:
            raise UsageError(f"{self.path}: {name} must be an integer from {least} to {MAX_SIZE:.0e}, got {brief(v)}")
        return v

    def model_spec(
        self,
        base: ModelSpec | None,
        tp: int | None = None,
        beside: str = "--config FILE (a Hugging Face config.json) or --model NAME",
        **given: Any,
    ) -> ModelSpec:
        """The job's model: `base` (the model given beside the file: --config, --model or sizes) with the
        fields the file sets in its place, and `given` sizes (a command's own flags) over both. A file that
        describes no model of its own needs a base (`beside`: the flags that give one, in the refusal); `tp` is
        unused (Megatron's reader pads by it)."""
        from dataclasses import replace

        sizes = {k: v for k, v in given.items() if v is not None}
        if base is None:
            fields_ = {**self.model, **sizes}
            if any(fields_.get(k) is None for k in ("layers", "hidden", "heads", "vocab")):
                named = f" (it names {self.model_name}: give that model's config.json)" if self.model_name else ""
                raise UsageError(
                    f"{self.path}: a {self.title} does not describe the whole model{named}: give {beside} beside --job"
                )
            return ModelSpec(name=f"{self.path.rsplit('/', 1)[-1]} ({self.title})", **fields_)
        if all(self.model.get(k) is not None for k in ("layers", "hidden", "heads", "vocab")):
            raise UsageError(
                f"{self.path}: the {self.title} gives its own model ({self.model['layers']} layers of "
                f"{self.model['hidden']}): give --job without --model or --config (sizes given here replace its own)"
            )
        fields_ = {**self.model, **sizes}
        if not fields_:
            return base
        # a count stated for the base's shapes no longer holds once the file changes them; the name says whose
        name = f"{base.name} with the {self.title}'s " + ", ".join(f"{k} {v}" for k, v in fields_.items())
        return replace(base, **{"params": None, "name": name, **fields_}).require("layers", "hidden", "heads", "vocab")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "used": [{"field": f, "means": m} for f, m in self.used],
            "unmodelled": self.unmodelled,
            "contradictions": self.contradictions,
            "assumed": self.assumed,
            "no_effect": self.no_effect,
            "unknown": self.unknown,
            "model": self.model,
            "model_name": self.model_name,
            "world": self.world,
            "gpus_per_node": self.gpus_per_node,
            "layout": self.layout,
            "step": self.step,
            "seq": self.seq,
            "overlap": self.overlap,
            "sets": list(self.sets),
        }


def _shown(v: Any) -> str:
    """A field's value as its file writes it (JSON's and TOML's spelling: true, null, "text", 1e9 as 1e+09)."""
    import json

    if isinstance(v, float) and v.is_integer() and abs(v) >= 1e6:
        return f"{v:g}"
    if isinstance(v, (bool, str, type(None), int, float)):
        text = json.dumps(v)
        return text if len(text) <= 60 else text[:57] + "..."
    return brief(v)


def leaves(tree: Any, path: str, what: str) -> dict[str, Any]:
    """Every leaf of a parsed file (JSON or TOML) by its dotted name: `{"a": {"b": 1}}` is `{"a.b": 1}`. A list
    is a leaf (DeepSpeed's betas, torchtitan's converters); an empty table is a leaf of its own (a section
    given with nothing in it). Bounded in depth and count."""
    if not isinstance(tree, dict):
        raise UsageError(f"{path}: expected {what} (an object of fields), got {type(tree).__name__}")
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str, depth: int) -> None:
        if depth > DEPTH:
            raise UsageError(f"{path}: fields nested more than {DEPTH} deep at {prefix[:-1]}: not {what}")
        for key, value in node.items():
            name = prefix + str(key)
            if isinstance(value, dict) and value:
                walk(value, name + ".", depth + 1)
            else:
                out[name] = value
                if len(out) > FIELDS_AT_MOST:
                    raise UsageError(f"{path}: more than {FIELDS_AT_MOST:,} fields: not {what}")

    walk(tree, "", 1)
    return out


def account(job: ReadJob, table: tuple[JobField, ...]) -> None:
    """Every field of the file the reader did not use: a field the table leaves out gets its line (once per
    field, with its value), one of no effect is listed, one the table lacks is unknown."""
    for name, value in job.values.items():
        if name in job.read:
            continue
        entry = next((f for f in table if f.matches(name)), None)
        if entry is None:
            job.unknown.append(name)
        elif entry.role == UNMODELLED:
            job.unmodelled.append(f"{name} {_shown(value)}: {entry.means}")
        else:
            job.no_effect.append(name)


def parse_set(text: str) -> tuple[str, Any]:
    """`--job-set NAME=VALUE`: the dotted field and its value (an integer, a number, true/false or text), as a
    stack's own command line overrides a field (torchtitan's `--parallelism.tensor_parallel_degree 8`)."""
    name, eq, raw = text.partition("=")
    name = name.strip().removeprefix("--")
    if not eq or not name or not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"--job-set {brief(text)}: expected NAME=VALUE (such as parallelism.tensor_parallel_degree=8)")
    raw = raw.strip()
    if raw.lower() in ("true", "false"):
        return name, raw.lower() == "true"
    for kind in (int, float):
        try:
            return name, kind(raw)
        except ValueError:
            pass
    return name, raw


def with_sets(values: dict[str, Any], sets: tuple[str, ...]) -> dict[str, Any]:
    """A file's fields with each `--job-set NAME=VALUE` in place (a field the file lacks is added)."""
    out = dict(values)
    for text in sets:
        name, value = parse_set(text)
        out[name] = value
    return out


def plural(n: int, word: str) -> str:
    """ "1 sequence", "8 sequences", "3 micro-batches"."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}{'es' if word.endswith('ch') else 's'}"


def step_defaults(**given: Any) -> dict[str, Any]:
    """A step's choices where a stack's file does not set them: parasim's own defaults (FlashAttention, no
    dropout kept, one sequence a micro-batch, no recomputation, the whole vocabulary's logits at once)."""
    return {
        "micro_batch": 1,
        "global_batch": None,
        "recompute": "none",
        "flash": True,
        "dropout": False,
        "chunks": 1,
        "precision": "post",
        "dispatcher": "alltoall",
        **given,
    }


def layout_defaults(**given: Any) -> dict[str, Any]:
    """Degrees a stack's file does not set: one of each (expert TP: TP's), ZeRO off, Megatron's rank order."""
    from ..layout.axes import SIZED

    # DP is what the world leaves (Megatron's jobs give no DP either)
    ones = {name: 1 for name in SIZED if name != "dp"}
    out = {**ones, "sp": False, "zero": 0, "order": "tp-cp-ep-dp-pp", **given}
    if "etp" not in given:  # no expert split given: the experts' TP follows TP, as Megatron's default does
        out["etp"] = out["tp"]
    return out


__all__ = [
    "JobField",
    "ReadJob",
    "account",
    "leaves",
    "layout_defaults",
    "plural",
    "set_field",
    "step_defaults",
    "tree_of",
    "Written",
    "USED",
    "UNMODELLED",
    "NO_EFFECT",
]


def set_field(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """`tree`'s field `dotted` ("zero_optimization.stage") set to `value`, its tables made where missing."""
    *path, last = dotted.split(".")
    node = tree
    for key in path:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[last] = value


@dataclass(frozen=True)
class Written:
    """A plan written as a stack's file: its text, and what the plan holds that the stack cannot say (one line
    each: the file runs something else there)."""

    format: str
    text: str
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "text": self.text, "notes": list(self.notes)}


def tree_of(job: ReadJob | None) -> dict[str, Any]:
    """The file `job` was read from, as its tables again (its fields in their order); empty without a job. A
    writer starts from it, so what parasim does not set comes back as the user wrote it."""
    tree: dict[str, Any] = {}
    for name, value in job.values.items() if job is not None else ():
        set_field(tree, name, value)
    return tree
