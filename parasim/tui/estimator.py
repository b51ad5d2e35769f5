"""The estimator as a live view, in plain Python (no Textual): a job's settings a learner moves one step at a
time (model, sequence, micro-batch, TP, SP, CP, PP, DP, ZeRO, EP, recomputation, GPU) and, after each move,
the answer `parasim memory` gives for them: memory item by item against what the GPU can use, whether it fits,
the step's time and tokens per second. The app (tui/estimator_app.py) draws what `Estimator.answer` returns.

A setting that breaks a layout rule (TP that does not divide the heads, an MoE model with TP and no SP) is not
refused: the answer says why, as the command would, and the next move may mend it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..estimate.memory import RECOMPUTE

POWERS = tuple(2**i for i in range(13))  # 1 ... 4,096: degrees, micro-batches
SEQS = tuple(2**i for i in range(9, 21))  # 512 ... 1,048,576 tokens


@dataclass(frozen=True)
class Setting:
    """One row of the view: its name, what it is in words, and the values a move steps through."""

    name: str
    what: str
    values: tuple[Any, ...]


@dataclass
class Estimator:
    """The settings on screen (`values`: name -> value) of `model`, and the models a learner may switch to."""

    model: Any  # the ModelSpec on screen
    values: dict[str, Any]
    models: dict[str, Any] = field(default_factory=dict)  # name -> ModelSpec, in the order a move cycles them
    plan: Any = None  # the starting plan: what the view does not move (micro-batches, kernels, precision) stays its
    overlap: tuple[str, ...] = ()
    held: list | None = None  # the held-out runs' table every answer's range is read from: made on the first

    @classmethod
    def from_query(cls, q: Any) -> "Estimator":
        """The view of a JobQuery: its model (first among the presets), plan, sequence and GPU."""
        from ..estimate.models import get_model
        from ..layout import PRESETS

        models = {q.model.name: q.model}
        for name in PRESETS:  # each preset's model once (the layout presets share the 27B's)
            m = get_model(name)
            models.setdefault(m.name, m)
        p = q.plan
        values = dict(
            model=q.model.name,
            seq=q.seq,
            micro_batch=p.micro_batch,
            tp=p.tp,
            sp=p.sp,
            cp=p.cp,
            pp=p.pp,
            dp=p.dp,
            zero=p.zero,
            ep=p.ep,
            recompute=p.recompute,
            gpu=q.gpu,
        )
        return cls(q.model, values, models, p, q.overlap)

    def settings(self) -> list[Setting]:
        from ..estimate.hardware import GPUS

        experts = tuple(e for e in POWERS if e <= max(1, self.model.experts) and (self.model.experts or 1) % e == 0)
        return [
            Setting("model", "the model", tuple(self.models)),
            Setting("seq", "sequence length, tokens", SEQS),
            Setting("micro_batch", "sequences a micro-batch", POWERS[:8]),
            Setting("tp", "tensor parallel", POWERS[:7]),
            Setting("sp", "sequence parallel (with TP)", (False, True)),
            Setting("cp", "context parallel", POWERS[:9]),
            Setting("pp", "pipeline stages", POWERS[:8]),
            Setting("dp", "data parallel", POWERS),
            Setting("zero", "ZeRO stage over DP x CP", (0, 1, 2, 3)),
            Setting("ep", "expert parallel", experts),
            Setting("recompute", "activation recomputation", RECOMPUTE),
            Setting("gpu", "GPU", tuple(GPUS)),
        ]

    def move(self, name: str, step: int) -> None:
        """Setting `name` one value up (`step` 1) or down (-1) its list, stopping at either end; a value between
        two of the list's (a sequence of 3,000) moves to the next one that way."""
        values = next(s.values for s in self.settings() if s.name == name)
        now = self.values[name]
        if now in values:
            i = values.index(now) + step
        else:  # off the list: the nearest value that way
            ahead = [i for i, v in enumerate(values) if (v > now if step > 0 else v < now)]
            i = (ahead[0] if step > 0 else ahead[-1]) if ahead else values.index(values[-1 if step > 0 else 0])
        self.values[name] = values[max(0, min(len(values) - 1, i))]
        if name == "model":
            self.model = self.models[self.values["model"]]
            if not self.model.experts:
                self.values["ep"] = 1

    def query(self) -> Any:
        """The JobQuery of the settings on screen (UsageError: a rule they break)."""
        from dataclasses import replace

        from ..estimate.memory import Plan
        from ..estimate.traffic import gpu_spec
        from ..job.query import JobQuery

        v = self.values
        moved = {k: x for k, x in v.items() if k not in ("model", "seq", "gpu")}  # the plan's own settings
        if not self.model.experts:
            moved["etp"] = 1  # a dense model has no experts to split
        start = self.plan if self.plan is not None else Plan()
        plan = replace(start, world=None, **moved).check(self.model, v["seq"])
        return JobQuery(self.model, plan, v["seq"], v["gpu"], gpu_spec(v["gpu"], "gpu").usable, self.overlap)

    def answer(self) -> dict[str, Any]:
        """What the view draws: the items (GB), the usable memory, fits, the step's time and tokens per second
        a GPU, the layout in words; or `refused`, the rule the settings break."""
        from ..job.memory import memory_report

        if self.held is None:
            from ..clock.uncertainty import held_out

            self.held = held_out()  # seconds: every published run timed once, not at every move
        try:
            q = self.query()
            report = memory_report(q, held=self.held)
        except UsageError as exc:
            return {"refused": str(exc)}
        d = report.to_dict()
        t = d["time"]
        return {
            "label": f"{q.plan.label()} on {q.plan.world:,} GPUs",
            "items": {k: d["items"][k] for k in report.breakdown.shown()},
            "total": d["total"],
            "usable": d["usable"],
            "fits": d["fits"],
            "step_s": t.get("step_s"),
            "tokens_per_s_per_gpu": t.get("tokens_per_s_per_gpu"),
            "gpu": report.gpu.name,
        }


def bar(items: dict[str, float], usable: float, width: int) -> list[tuple[str, int]]:
    """The stacked bar in `width` cells: each item's share of the larger of the total and the usable memory,
    as (item, cells), items of at least half a cell only; the cells never exceed `width`."""
    scale = max(sum(items.values()), usable, 1e-12)
    out = []
    for name, gb in items.items():
        cells = round(gb / scale * width)
        if cells:
            out.append((name, cells))
    over = sum(c for _, c in out) - width
    while over > 0:  # rounding up may pass the width: take from the widest
        i = max(range(len(out)), key=lambda k: out[k][1])
        out[i] = (out[i][0], out[i][1] - 1)
        over -= 1
    return out


__all__ = ["Estimator", "Setting", "bar"]
