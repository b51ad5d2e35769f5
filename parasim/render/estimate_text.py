"""What `parasim memory` and `parasim fit` print: one GPU's memory itemised with its fit, traffic and step
time; the longest sequence of one layout; the best layout per node count. The commands parse and compute;
these functions only write what was computed."""

from __future__ import annotations

from typing import Any


def print_memory(
    console: Any,
    title: str,
    bd: Any,
    out: dict,
    fit_line: str,
    assumes: list[str],
    gpu_name: str,
    unit: float,
    name: str,
) -> None:
    """One GPU's memory, item by item with its share; then the model state, whether it fits (`fit_line`),
    what the estimate assumes, the bytes each GPU sends per step and the step's time."""
    from rich.table import Table

    console.print(title)  # above the table, not its title: a title wraps to the table's narrow width
    table = Table()
    table.add_column("item")
    table.add_column(name, justify="right")
    table.add_column("share", justify="right")
    for k, v in bd.shown().items():
        table.add_row(k, f"{v / unit:,.2f}", f"{v / bd.total:.0%}" if bd.total else "-")
    table.add_row("[bold]total[/]", f"[bold]{bd.total / unit:,.2f}[/]", "")
    console.print(table)
    console.print(precision_words(out, bd.model_state, unit, name))
    console.print(fit_line)
    console.print("assumes: " + "; ".join(assumes))
    traffic = ", ".join(f"{k} {v:,.2f}" for k, v in out["traffic"].items()) or "none"
    console.print(f"sent per GPU per step ({name}): {traffic}")
    console.print(time_words(out["time"], gpu_name))


def precision_words(out: dict, model_state: float, unit: float, name: str) -> str:
    """The model state's size, per parameter this GPU holds, and the precision convention it is counted in."""
    p = out["precision"]
    per = p["bytes_per_param"]
    return (
        f"model state {model_state / unit:,.2f} {name}: {out['bytes_per_param']:.2f} bytes per parameter this "
        f"GPU holds ({out['params_held']:,.0f}), at precision {p['name']} (weights {per['weights']}, gradients "
        f"{per['gradients']}, optimizer {per['optimizer']} bytes a parameter before ZeRO shards them)"
    )


def seconds(s: float) -> str:
    """A time as a reader wants it: seconds to two places from a tenth of a second up, else milliseconds or
    microseconds (a toy model's step is a few of them, which two places of a second would print as 0.00 s)."""
    if s == 0 or abs(s) >= 0.1:
        return f"{s:,.2f} s"
    return f"{s * 1e3:,.2f} ms" if abs(s) >= 1e-4 else f"{s * 1e6:,.1f} us"


def time_words(t: dict, gpu_name: str) -> str:
    """One step's time on the clock, where it goes, and what it yields; or why there is none on this GPU type."""
    if t.get("step_s") is None:
        return f"step: not timed on {gpu_name}: {t['why']}"
    parts = t["parts_per_microbatch_s"]
    compute = (parts["matmul"] + parts["attention"] + parts["elementwise"] + parts["logits"]) * t["microbatches"]
    comm = {k: parts[k] * t["microbatches"] for k in ("tp", "cp", "ep") if parts[k]}
    by = {"ep": f" ({t['dispatcher']})" if t.get("dispatcher") else ""}  # how the EP time's tokens travel
    hidden = t.get("tp_hidden_s", 0.0) * t["microbatches"]  # TP overlap's measured share: below zero, it costs
    if hidden:
        by["tp"] = (
            f" (overlap hides {seconds(hidden)})"
            if hidden > 0
            else f" (overlap adds {seconds(-hidden)}: measured slower than none on this GPU)"
        )
    said = ", ".join(f"{k.upper()} {seconds(v)}{by.get(k, '')}" for k, v in comm.items())
    extra = [
        f"pipeline bubble {seconds(t['bubble_s'])}" if t["bubble_s"] else "",
        f"DP exposed {seconds(t['exposed_grads_s'] + t['exposed_params_s'])}"
        if t["exposed_grads_s"] + t["exposed_params_s"]
        else "",
    ]
    rest = "; ".join(x for x in [said] + extra if x)
    over = ", ".join(t["overlap"]) or "none"
    return (
        f"step: {seconds(t['step_s'])} on {gpu_name} (the clock: compute {seconds(compute)}"
        + (f"; {rest}" if rest else "")
        + f"; overlap: {over}): {t['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU "
        f"{t['mfu']:.0%}" + (f"; {range_words(t['range'])}" if t.get("range") else "")
    )


def range_words(r: dict) -> str:
    """A step time's range (clock/uncertainty.py): what the held-out runs like it measured against parasim."""
    return (
        f"runs like it measured {seconds(r['low_s'])} to {seconds(r['high_s'])} ({r['low_ratio']:.2f}x to "
        f"{r['high_ratio']:.2f}x parasim's step: {len(r['runs'])} {r['like']})"
    )


def search_lines(model_name: str, result: dict, name: str) -> list[str]:
    """`fit --search`: the best layout for each node count (and its layers on stages where they are unlike)."""
    from ..layout.stages import describe

    lines = [
        f"{model_name}: the longest sequence per node count ({result['layouts_tried']:,} layouts, "
        f"{result['usable']:g} {name} usable per GPU)"
    ]
    for row in result["nodes"]:
        b = row["best"]
        uneven = f" ({describe(tuple(b['stage_layers']))})" if "stage_layers" in b else ""
        lines.append(f"  {row['nodes']:>4} nodes  {b['max_seq_tokens']:>12,} tokens  {b['label']}{uneven}")
    return lines


def time_search_lines(model_name: str, result: dict, gpu_name: str) -> list[str]:
    """`fit --search --by time`: per node count, the layouts that fit ranked by the step's time, and for each
    after the first the part of the step that costs it most against the winner."""
    lines = [
        f"{model_name}: the fastest layouts per node count at {result['seq']:,} tokens, {result['global_batch']:,} "
        f"sequences a step, on {gpu_name}s (the clock's step time; overlap: {', '.join(result['overlap']) or 'none'})"
    ]
    spreads: dict[str, tuple[int, float, float]] = {}
    for row in result["nodes"]:
        left = [f"{row['not_fitting']:,} do not fit"] + (
            [f"{row['batch_not_dividing']:,} do not divide the batch"] if row["batch_not_dividing"] else []
        )
        lines.append(
            f"  {row['nodes']} node{'s' if row['nodes'] != 1 else ''} ({row['gpus']:,} GPUs): "
            f"{row['layouts']:,} layouts ranked ({'; '.join(left)})"
        )
        if row["best"] is None:
            lines.append("    none fits this sequence and batch")
            continue
        for k, r in enumerate(row["top"]):
            rng = r["range"]
            spreads[rng["like"]] = (len(rng["runs"]), rng["low_ratio"], rng["high_ratio"])
            head = (
                f"    {k + 1}. {r['label']}: {seconds(r['step_s'])} a step (runs like it: {seconds(rng['low_s'])} to "
                f"{seconds(rng['high_s'])}), {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {r['mfu']:.0%}"
            )
            if "loses" in r:
                lose = r["loses"]
                head += (
                    f"; {lose['slower']:.1%} slower than 1, most of it {lose['words']} (+{seconds(lose['most_s'])})"
                    if lose["most_s"] > 0
                    else "; as fast as 1"
                )
            lines.append(head)
    for like, (n, low, high) in spreads.items():
        lines.append(
            f"  runs like it: the measured steps of {n} {like}, {low:.2f}x to {high:.2f}x parasim's "
            f"(clock/uncertainty.py)"
        )
    return lines


def spread(label: str, world: int) -> str:
    """Where a plan runs, for a report's first line: its layout on its GPUs, or one GPU said as a choice the
    user can change (a plan given no degrees and no --gpus is a one-GPU plan, which is rarely the question)."""
    if world == 1:
        return "one GPU (--tp, --pp, --dp or --gpus N spread it)"
    return f"{label} on {world} GPUs"


def fit_lines(
    model_name: str, label: str, world: int, f: Any, out: dict, gpu_name: str, unit: float, name: str
) -> list[str]:
    """`fit` of one layout: the longest sequence, the stage that binds and its memory item by item, and one
    step's time at that length."""
    lines = [
        f"{model_name}, {spread(label, world)}, {out['usable']:g} {name} usable per GPU:",
        f"  longest sequence {f.seq:,} tokens (stage {f.at_max.stage + 1} binds; model state "
        f"{out['model_state']:.2f} {name})",
    ]
    lines += [f"    {k:<24} {v / unit:10.2f} {name}" for k, v in f.at_max.shown().items()]
    if not f.seq:
        lines.append("  nothing fits: the model state alone exceeds the usable memory")
    elif out["time"].get("step_s") is None:
        lines.append(f"  {time_words(out['time'], gpu_name)}")
    else:
        lines.append(
            f"  one step at that length, {time_words(out['time'], gpu_name)} (attention "
            f"{out['attention_flops']:.3g} FLOPs per sequence)"
        )
    return lines


def hardware_report(console: Any, hw: dict) -> None:
    """The hardware table: a row per figure, a column per GPU type, then each source with its address."""
    from rich.markup import escape
    from rich.table import Table
    from ..estimate.hardware import LATENCY_WHAT, UNITS, WHAT

    gpus = hw["gpus"]
    table = Table(
        title="The GPU constants parasim uses (per GPU; NVLink and network per direction)", title_justify="left"
    )
    table.add_column("figure")
    for g in gpus.values():
        table.add_column(g["name"], justify="right")
    for key, what in WHAT.items():
        scale, unit = UNITS[key]
        table.add_row(
            f"{what} ({unit})",
            *[
                f"{g[key]['value'] / scale:,.4g}\n[dim]"
                + escape(f"{g[key]['printed']} [{g[key]['source']}]")
                + "[/dim]"
                for g in gpus.values()
            ],
        )
    console.print(table)
    clock = Table(title="NCCL's latencies (every GPU type alike)", title_justify="left")
    for col in ("constant", "value", "as the source prints it"):
        clock.add_column(col)
    for key, f in hw["latency"].items():
        clock.add_row(
            f"latency: {LATENCY_WHAT[key]}", f"{f['value'] * 1e6:g} us", escape(f"{f['printed']} [{f['source']}]")
        )
    console.print(clock)
    kernels = hw["kernels"]
    measured = Table(
        title="Measured kernel costs at a few points (estimate/kernels.py; every point, source and "
        "note: parasim hardware --json, docs/notes/kernel-costs.md)",
        title_justify="left",
    )
    measured.add_column("kernel")
    for g in gpus.values():
        measured.add_column(g["name"], justify="right")
    labels = list(next(iter(kernels["samples"].values())))
    for label in labels:
        cells = []
        for key in gpus:
            row = kernels["samples"][key][label]
            v = row["value"]
            shown = "-" if v is None else f"{v / 1e9:,.0f}" if v > 10 else f"{v:.0%}"
            cells.append(shown + "\n[dim]" + escape(f"[{', '.join(row['sources']) or 'none'}]") + "[/dim]")
        measured.add_row(label, *cells)
    console.print(measured)
    for key, missing in kernels.get("lacking", {}).items():
        if missing:
            console.print(
                escape(
                    f"{gpus[key]['name']}: no measured {', '.join(missing)} table yet, so a step that "
                    "runs one is not timed on it (memory planning needs only the datasheet figures)"
                )
            )
    for key, src in kernels["sources"].items():
        console.print(
            f"[bold]{escape('[' + key + ']')}[/bold] " + escape(f"{src['document']} ({src['where']}). {src['address']}")
        )
    for key, src in hw["sources"].items():
        console.print(
            f"[bold]{escape('[' + key + ']')}[/bold] " + escape(f"{src['document']}: {src['prints']}. {src['address']}")
        )


def config_lines(path: str, hf: Any) -> list[str]:
    """`--config FILE`: the fields read (each with its value), the parameters they count, and one line for
    each field that changes memory, traffic or time which parasim leaves out."""
    import textwrap

    model = hf.model
    fields = ", ".join(f"{k} {v}" for k, v in hf.used.items())
    lines = textwrap.wrap(
        f"Hugging Face config {path}: {model.total_params() / 1e9:,.2f}B parameters "
        f"({model.active_params() / 1e9:,.2f}B active, without the embeddings) from {fields}",
        100,
        subsequent_indent="  ",
        break_on_hyphens=False,
    )
    if hf.unmodelled:
        lines.append(f"  not modelled ({len(hf.unmodelled)}):")
        for line in hf.unmodelled:
            lines += textwrap.wrap(line, 100, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False)
    return lines


# a plan's fields as a learner reads them (the flags' words), where the field's own name is not
_FIELD_WORDS = {"m": "micro-batches", "micro_batch": "micro-batch", "zero": "ZeRO"}


def _field(name: str, was: Any, now: Any) -> str:
    """One field a rule moved, in the flags' words: "TP 16 -> 8", "SP off -> on"."""
    if isinstance(was, bool):
        was, now = ("on" if was else "off"), ("on" if now else "off")
    return f"{_FIELD_WORDS.get(name, name.upper())} {was} -> {now}"


def _finding_words(f: dict, unit: float, name: str) -> str:
    """One broken rule (clock/critic.Finding.to_dict()): the rule, why, the same GPUs following it, whether that
    fits, and what the figures leave out (the rule's note)."""
    note = f.get("note") or ""
    if f.get("figures"):
        note += ": " + ", ".join(f"{x['bytes'] / unit:,.2f} {name} {x['what']}" for x in f["figures"])
    note = f" {note}." if note else ""
    if f.get("still_broken"):  # the rules the layout shown still breaks: where following one at a time goes next
        from ..clock.critic import RULES

        says = {r.name: r.says for r in RULES}
        note += " The layout it leads to still breaks: " + "; ".join(says[n] for n in f["still_broken"]) + "."
    if f["followed"] is None:
        return f"- {f['says']}: {f['why']}. No layout of these GPUs follows it: {f['why_not']}.{note}"
    step = (
        "its step is not timed here"
        if f["step_s"] is None or f["followed_step_s"] is None
        else f"step {f['step_s']:.3g} s -> {f['followed_step_s']:.3g} s ({f['followed_step_s'] / f['step_s'] - 1:+.0%})"
    )

    def moved(changes: dict) -> str:
        return ", ".join(_field(k, a, b) for k, (a, b) in changes.items())

    room = f["usable_bytes"]
    said = (
        f"{f['followed']} ({moved(f['changes'])}): {step}, memory {f['memory_bytes'] / unit:.1f} -> "
        f"{f['followed_memory_bytes'] / unit:.1f} {name}"
    )
    if f.get("nearest") is not None:  # the nearest did not fit: a roomier plan that follows it was taken
        return (
            f"- {f['says']}: {f['why']}. Following it alone, {f['nearest']} ({moved(f['nearest_changes'])}) "
            f"does not fit: {f['nearest_memory_bytes'] / unit:.1f} {name} > {room / unit:.0f} {name} usable. "
            f"The nearest that follows it and fits: {said}.{note}"
        )
    if f.get("followed_fits") is False:
        from ..clock.critic import ROOMIER

        tried = f.get("tried") or []
        shown = ", ".join(tried[:3]) + (f" and {len(tried) - 3} more" if len(tried) > 3 else "")
        beside = (
            f"nor does any roomier layout tried that follows it ({shown})"
            if tried
            else f"and these GPUs give no roomier layout that follows it ({ROOMIER})"
        )
        why = (
            "here it cannot be followed without running out of memory"
            if f["memory_bytes"] <= room
            else "the layout as given does not fit either"
        )
        said += f": does not fit, {f['followed_memory_bytes'] / unit:.1f} {name} > {room / unit:.0f} {name} usable"
        return f"- {f['says']}: {f['why']}. Following it, {said}; {beside}: {why}.{note}"
    return f"- {f['says']}: {f['why']}. Following it, {said}.{note}"


def critic_lines(found: list[dict], unit: float, name: str) -> list[str]:
    """`memory --critic`: each rule of thumb the layout breaks, and what the same GPUs following it would take
    (clock/critic.py), or that it breaks none."""
    import textwrap

    from ..clock.critic import RULES

    if not found:
        return [""] + textwrap.wrap(
            f"Rules of thumb: this layout breaks none of those parasim holds a layout to "
            f"({'; '.join(r.says for r in RULES)}).",
            100,
            break_on_hyphens=False,
        )
    out = ["", "Rules of thumb this layout breaks, each against the same GPUs and batch with the rule followed:"]
    for f in found:
        out += textwrap.wrap(_finding_words(f, unit, name), 100, subsequent_indent="  ", break_on_hyphens=False)
    return out


def layout_check_lines(check: Any, unit: float, name: str) -> list[str]:
    """`parasim check-layout` (clock/critic.LayoutCheck): the layout, its step and memory, then every rule of
    thumb, broken ones first with what following each would take, then the ones it keeps."""
    import textwrap

    d = check.to_dict()
    step = "not timed here" if d["step_s"] is None else f"{d['step_s']:.3g} s"
    fits = "fits" if d["memory_bytes"] <= d["usable_bytes"] else "does not fit"
    out = textwrap.wrap(
        f"{d['model']}, {d['layout']}, s = {d['seq']:,}, on {d['gpu'].upper()}: a step {step}, "
        f"{d['memory_bytes'] / unit:.1f} {name} on the busiest GPU ({fits} in its "
        f"{d['usable_bytes'] / unit:.0f} {name} usable).",
        100,
        break_on_hyphens=False,
    )
    total = len(d["broken"]) + len(d["kept"])
    out += ["", f"Broken: {len(d['broken'])} of the {total} rules of thumb" + (":" if d["broken"] else ".")]
    for f in d["broken"]:
        out += textwrap.wrap(_finding_words(f, unit, name), 100, subsequent_indent="  ", break_on_hyphens=False)
    out += ["", f"Kept, or not in play here: {len(d['kept'])} of {total}" + (":" if d["kept"] else ".")]
    out += [f"- {r['says']}" for r in d["kept"]]
    return out
