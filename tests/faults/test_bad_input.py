"""Bad input, command by command: one line on stderr naming the reason, exit code 2, and no work started
(each case has seconds, not minutes; a size past a limit is refused before anything is allocated)."""
import json

import pytest

from parasim.cli import main
from conftest import cli

HF = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}


def _config(tmp_path, **fields) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, **fields}))
    return str(path)


CASES = [
    # sizes past what one machine can run or list
    (["lesson", "collectives", "--world", "100000000", "--plain"], "world size: 100,000,000 is more than the limit of 16,384"),
    (["run", "collectives", "--nproc", "100000"], "real ranks (processes): 100,000 is more than the limit of 128"),
    (["run", "all", "--nproc", "100000"], "real ranks (processes): 100,000 is more than the limit of 128"),
    (["schedule", "--pp", "100000", "-m", "100000"], "pp x microbatches x chunks: 10,000,000,000 is more than the limit"),
    (["schedule", "--pp", "4", "-m", "10000000"], "pp x microbatches x chunks: 40,000,000 is more than the limit"),
    (["layout", "--tp", "100000000"], "a world of 100,000,000 GPUs is more than the limit of 65,536"),
    (["memory", "--model", "27b", "--tp", "8", "--dp", "100000"], "a world of 800,000 GPUs is more than the limit"),
    (["fit", "--model", "27b", "--search", "--nodes", "1-4096"], "at most 512 node counts in one search"),
    (["layout", "--tp", "9" * 30], "expected a positive integer up to 1e+12"),
    (["memory", "--model", "27b", "--seq", "infK"], "expected a positive integer up to 1e+12, got 'infK'"),
    (["memory", "--model", "27b", "--seq", "1" + "0" * 5000], "expected a positive integer up to 1e+12"),
    # files that are not what they claim
    (["view", "/dev/zero"], "trace /dev/zero is not a regular file"),
    (["view", "/"], "trace / is not a regular file"),
    (["view", "/no/such/file.json"], "cannot read trace /no/such/file.json: No such file or directory"),
    (["memory", "--config", "/dev/zero"], "config /dev/zero is not a regular file"),
    (["memory", "--config", "{kv0}"], "field for kv_heads must be an integer from 1 to 1e+12, got 0"),
    (["memory", "--config", "{huge}"], "is not a model's config.json: hidden_size: an integer of 31 digits"),
    (["memory", "--config", "{digits}"], "is not a model's config.json: hidden_size: an integer of 5,001 digits"),
    # outputs that cannot be written as asked
    (["schedule", "--plot", "{folder}"], "--plot needs a file name (FILE.png)"),
    (["schedule", "--plot", "{folder}/x.foo"], "name a .png, .svg, .pdf file"),
    (["memory", "--model", "27b", "--plot", "x.jpg"], "name a .png, .svg, .pdf file"),
    (["lesson", "collectives", "--chrome", "", "--plain"], "an empty file name"),
    (["lesson", "--world", "4"], "--world apply to one lesson"),
    (["lesson", "--trace", "t.json"], "--trace apply to one lesson"),
    # layouts: one rule set for every command
    (["layout", "--tp", "1", "--sequence-parallel"], "sequence parallelism needs tp > 1"),
    (["memory", "--model", "27b", "--sequence-parallel"], "sequence parallelism needs tp > 1"),
    (["layout", "--tp", "2", "--hidden", "100", "--heads", "8"], "hidden 100 does not divide by heads 8"),
    # real-run settings
    (["run", "collectives", "--timeout", "nan"], "expected a number of seconds (such as 30 or 0.5), got 'nan'"),
    (["run", "collectives", "--timeout", "0"], "timeout must be a number of seconds above 0"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, needle", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    files = {"kv0": _config(tmp_path, num_key_value_heads=0), "folder": str(tmp_path)}
    (tmp_path / "huge.json").write_text(json.dumps({**HF, "hidden_size": 2**100}))
    (tmp_path / "digits.json").write_text(json.dumps(HF).replace('"hidden_size": 64', '"hidden_size": 1' + "0" * 5000))
    files.update(huge=str(tmp_path / "huge.json"), digits=str(tmp_path / "digits.json"))
    argv = [a.format(**files) if "{" in a else a for a in argv]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert needle in out.err and out.err.count("\n") == 1, out.err
    assert not (tmp_path / "x.foo").exists()


def test_without_torch_the_hint_is_the_readme_s_install_line(monkeypatch):
    """Real ranks without torch: one line naming what to install, as README writes it (`".[torch]"` from a
    checkout; no index package is called parasim)."""
    import sys as _sys
    from parasim.engine.launch import check_backend
    from parasim.errors import UsageError
    monkeypatch.setitem(_sys.modules, "torch", None)  # `import torch` now raises ImportError
    monkeypatch.setitem(_sys.modules, "torch.distributed", None)
    with pytest.raises(UsageError) as err:
        check_backend("gloo", 2, "cpu")
    text = str(err.value)
    assert "pip install torch" in text and 'pip install ".[torch]"' in text and "parasim[torch]" not in text
    assert "\n" not in text


def test_an_unknown_flag_names_the_command_s_own_help():
    out = cli("lesson", "sp", "--bogus")
    assert out.returncode == 2 and out.stderr.strip() == \
        "parasim lesson: unrecognized arguments: --bogus (see parasim lesson --help)"


def test_interleaved_with_m_not_a_multiple_of_p_says_what_megatron_and_torch_do():
    out = cli("schedule", "--pp", "4", "-m", "6", "--schedule", "interleaved", "--chunks", "2", "--json")
    assert out.returncode == 0
    note = json.loads(out.stdout)["note"]
    assert "not a multiple of p = 4" in note and "Megatron-LM refuses" in note and "1 round of 6" in note
    text = cli("schedule", "--pp", "4", "-m", "6", "--schedule", "interleaved", "--chunks", "2").stdout
    assert "note: m = 6 is not a multiple of p = 4" in text and max(map(len, text.splitlines())) <= 100
    assert "note" not in json.loads(cli("schedule", "--pp", "4", "-m", "8", "--schedule", "interleaved",
                                        "--chunks", "2", "--json").stdout)
