"""Issue 52: `parasim memory` is one library call. A notebook that builds the job by hand (job/'s JobQuery)
and asks `memory_report` gets exactly what the command prints under --json; the query is the flags, parsed."""
import json

from parasim.cli import main
from parasim.estimate.memory import Plan
from parasim.estimate.models import get_model
from parasim.estimate.traffic import gpu_presets
from parasim.job import GIB, JobQuery, Sources, memory_report
from parasim.jsonout import dumps


def _cli(capsys, *argv: str) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_query_built_by_hand_gives_the_commands_answer(capsys):
    model = get_model("27b")
    plan = Plan(tp=2, pp=2, world=16).check(model, 8192)
    q = JobQuery(model, plan, 8192, "h100", gpu_presets()["h100"].usable, ("grad-reduce",))
    got = json.loads(dumps(memory_report(q, critic=True).to_dict()))
    assert got == _cli(capsys, "--model", "27b", "--tp", "2", "--pp", "2", "--gpus", "16", "--seq", "8192",
                       "--gpu", "H100", "--overlap", "grad-reduce", "--critic")


def test_the_units_and_the_usable_memory_are_the_querys(capsys):
    model = get_model("27b")
    plan = Plan(tp=8, world=8).check(model, 4096)
    q = JobQuery(model, plan, 4096, "h200", 70 * GIB.size, units=GIB)
    report = memory_report(q)
    got = report.to_dict()
    assert got["unit"] == "GiB" and got["usable"] == 70.0
    assert got["fits"] == (report.breakdown.total <= 70 * 2 ** 30)
    assert json.loads(dumps(got)) == _cli(capsys, "--model", "27b", "--tp", "8", "--gpus", "8", "--gib",
                                          "--usable", "70")


def test_the_sources_say_what_was_read(tmp_path):
    """A query with no files read adds no "megatron" or "config" key; one with a config names its path."""
    model = get_model("27b")
    plan = Plan(tp=8, world=8).check(model, 4096)
    bare = memory_report(JobQuery(model, plan, 4096, "h200", 1e11)).to_dict()
    assert "megatron" not in bare and "config" not in bare
    assert Sources().to_dict() == {}
    from parasim.estimate.models import read_hf_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                                "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000}))
    hf = read_hf_config(str(path))
    said = Sources(config=hf, config_path=str(path)).to_dict()
    assert list(said) == ["config"] and said["config"]["path"] == str(path)
    assert said["config"]["params"] == hf.model.total_params()


def test_fit_built_by_hand_gives_the_commands_answer(capsys):
    """`parasim fit` for one layout is `fit_report`: the query's sequence left out, since it is the answer."""
    from parasim.job import fit_report
    model = get_model("27b")
    plan = Plan(tp=8, world=8).check(model)
    report = fit_report(JobQuery(model, plan, None, "h200", gpu_presets()["h200"].usable))
    assert main(["fit", "--model", "27b", "--tp", "8", "--gpus", "8", "--json"]) == 0
    assert json.loads(dumps(report.to_dict())) == json.loads(capsys.readouterr().out)
    assert report.to_dict()["time"]["step_s"] > 0 and report.fit.seq > 0


def test_a_memory_report_needs_its_sequence():
    import pytest
    from parasim.errors import UsageError
    model = get_model("27b")
    plan = Plan(tp=8, world=8).check(model)
    with pytest.raises(UsageError, match="one sequence length"):
        memory_report(JobQuery(model, plan, None, "h200", 1e11))


def test_an_unknown_gpu_type_is_one_line_from_python():
    """A notebook's query names its GPU type by key: one that the hardware table lacks is a UsageError that lists
    the types (the commands check their --gpu with the same call), for memory and fit alike, in any case."""
    import pytest
    from parasim.errors import UsageError
    from parasim.estimate.traffic import gpu_spec
    from parasim.job import fit_report
    model = get_model("27b")
    plan = Plan(tp=8, world=8).check(model)
    for report, seq in ((memory_report, 4096), (fit_report, None)):
        with pytest.raises(UsageError, match=r"^unknown gpu 'x100'; presets: .*\bh200\b"):
            report(JobQuery(model, plan, seq, "x100", 1e11))
    assert gpu_spec("H200") == gpu_presets()["h200"] and gpu_spec("a100").name == gpu_presets()["a100"].name


def test_a_notebook_holds_the_estimate_against_a_symbolic_step_as_the_commands_do(capsys):
    """`memory --symbolic` and `fit --symbolic` are library calls (issue 52's thin CLI): the same query with
    `against` (a routing policy) gives the command's --json, and the progress line goes to the caller's
    function, not to stderr."""
    import pytest
    from parasim.errors import UsageError
    from parasim.job import fit_run_report
    model = get_model("27b")
    plan = Plan(tp=8, sp=True, world=8).check(model, 4096)
    told: list[str] = []
    got = memory_report(JobQuery(model, plan, 4096, "h200", gpu_presets()["h200"].usable), against="balanced",
                        progress=told.append).to_dict()
    assert told == ["running one training step on 8 symbolic ranks (folded) at 4,096 tokens ..."]
    assert capsys.readouterr().err == ""
    assert json.loads(dumps(got)) == _cli(capsys, "--model", "27b", "--tp", "8", "--sp", "--seq", "4096",
                                          "--symbolic")
    assert got["run"]["rows"] and got["run"]["run_total"] > 0
    fitted = fit_run_report(JobQuery(model, plan, None, "h200", gpu_presets()["h200"].usable)).to_dict()
    assert main(["fit", "--model", "27b", "--tp", "8", "--sp", "--symbolic", "--json"]) == 0
    assert json.loads(dumps(fitted)) == json.loads(capsys.readouterr().out)
    assert fitted["seq"] > 0 and fitted["seq"] % fitted["granule"] == 0
    in_gib = fit_run_report(JobQuery(model, plan, None, "h200", gpu_presets()["h200"].usable, units=GIB)).to_dict()
    assert in_gib["unit"] == "GiB" and in_gib["seq"] == fitted["seq"]
    # what the step cannot run is refused in one line before anything runs (no progress line)
    zero3 = Plan(tp=8, zero=3, world=8).check(model)
    with pytest.raises(UsageError, match="cannot run ZeRO-3"):
        fit_run_report(JobQuery(model, zero3, None, "h200", 1e11), progress=told.append)
    assert len(told) == 1


def test_fit_seq_rounds_down_to_what_the_layout_splits_evenly():
    # CP 2 cuts a sequence in 2 x 2 chunks, SP over TP 4 cuts each again: 16 tokens a step of length
    from parasim.job import fit_seq
    assert fit_seq(1000, Plan(tp=4, cp=2, sp=True, world=8)) == 992
    assert fit_seq(1000, Plan(tp=4, cp=2, world=8)) == 1000
    assert fit_seq(1001, Plan(world=1)) == 1000


# what `fit --search` holds fixed when no flag says otherwise: every layout tried with these
SEARCH_DEFAULTS = dict(zero=None, recompute=None, flash=True, dropout=True, micro_batch=1, chunked_loss=False,
                       precision="post")


def test_a_search_built_by_hand_gives_the_commands_answer(capsys):
    """`fit --search` is `search_report` (by length, each best written as a Megatron job) and `fit --search --by
    time` is `time_search_report`: a SearchQuery built by hand gets what the command prints."""
    from parasim.job.search import SearchQuery, search_report, time_search_report
    model = get_model("27b")
    q = SearchQuery(model, range(1, 3), gpu_presets()["h100"].usable, SEARCH_DEFAULTS, top=2)
    got = json.loads(dumps(search_report(q, written=True).to_dict()))
    assert main(["fit", "--model", "27b", "--search", "--nodes", "1-2", "--top", "2", "--gpu", "H100",
                 "--megatron-args", "--json"]) == 0
    assert got == json.loads(capsys.readouterr().out)
    best = got["nodes"][0]["best"]
    assert best["megatron_args"] and best["seq_length"] <= best["max_seq_tokens"]
    timed_q = SearchQuery(model, range(1, 2), gpu_presets()["h100"].usable, SEARCH_DEFAULTS, top=2, units=GIB)
    got = json.loads(dumps(time_search_report(timed_q, 4096, 64, "h100").to_dict()))
    assert main(["fit", "--model", "27b", "--search", "--by", "time", "--nodes", "1", "--top", "2", "--gpu", "H100",
                 "--global-batch", "64", "--gib", "--json"]) == 0
    assert got == json.loads(capsys.readouterr().out)
    assert got["unit"] == "GiB"


def test_a_searchs_best_is_written_as_the_plan_it_ranked():
    """Worked apart from search_report: the best row made a Plan by hand (its own fields, the dropout the search
    held, 8 GPUs a node), at the longest length its layout splits evenly (2 x cp chunks, each cut over TP by
    SP), written as Megatron flags; the usable memory said in the query's unit, and what was read named."""
    from parasim.job.search import SearchQuery, search_report
    from parasim.megatron.args import as_dict
    model = get_model("27b")
    usable = gpu_presets()["h100"].usable
    for units in (None, GIB):  # two nodes of four GPUs
        q = SearchQuery(model, range(2, 3), usable, SEARCH_DEFAULTS, gpus_per_node=4, top=1,
                        **({"units": units} if units else {}))
        got = search_report(q, written=True).to_dict()
        assert got["usable"] == usable / (2 ** 30 if units else 1e9)
    best = got["nodes"][0]["best"]
    assert best["world"] == 8
    keys = ("tp", "sp", "cp", "pp", "dp", "ep", "etp", "zero", "recompute", "flash", "micro_batch", "microbatches",
            "chunked_loss", "precision", "attention_kernel", "fusion", "dispatcher")
    plan = Plan(**{k: best[k] for k in keys}, dropout=True, gpus_per_node=4).check(model)
    unit = 2 * best["cp"] * (best["tp"] if best["sp"] else 1)
    seq = best["max_seq_tokens"] // unit * unit
    assert best["seq_length"] == seq > 0
    assert best["megatron_args"] == json.loads(dumps(as_dict(model, plan, seq, (), None)))
    assert "config" not in got
    read = Sources(config_path="config.json", config=_tiny_config())
    said = search_report(SearchQuery(model, range(1, 2), usable, SEARCH_DEFAULTS, top=1, sources=read)).to_dict()
    assert said["config"]["path"] == "config.json"


def test_a_best_that_holds_no_sequence_is_not_written():
    """DeepSeek-V3 on one node of H100s holds no sequence at all: its best row says 0 tokens and no job."""
    from parasim.job.search import SearchQuery, search_report
    q = SearchQuery(get_model("deepseek-v3"), range(1, 2), gpu_presets()["h100"].usable, SEARCH_DEFAULTS, top=1)
    best = search_report(q, written=True).to_dict()["nodes"][0]["best"]
    assert best is not None and best["max_seq_tokens"] == 0
    assert "megatron_args" not in best and "seq_length" not in best


def _tiny_config():
    import tempfile
    from parasim.estimate.models import read_hf_config
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/config.json"
        with open(path, "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                       "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000}, f)
        return read_hf_config(path)
