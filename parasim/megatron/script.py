"""A Megatron-LM launch script read as bash would read it, without running anything.

Launch scripts (Megatron-LM's examples/) set variables and bash arrays, then run one line: `torchrun
<launcher flags> pretrain_gpt.py <training flags>`. This reader follows that much of bash: comments, line
continuations, quotes, `NAME=value`, `NAME=(...)` and `NAME+=(...)`, `export`, `$NAME`, `${NAME}`,
`${NAME:-default}`, `${ARRAY[@]}`, `$((arithmetic))`, and `if`/`elif`/`else`/`fi` over `[ ... ]` and
`[[ ... ]]` tests. It runs no command: a command substitution, `$(...)` or `` `...` ``, reads as empty, loops
and functions are skipped, and each such place is noted. The script gets no arguments and no environment, so
`$1` is empty and `${NODES:-1}` takes its default, as a fresh shell would.

Every script is read in bounded time and memory: the script itself is at most SCRIPT_BYTES, `if`s nest at most
IF_DEPTH deep, and expansion is held to the limits of megatron/words.py (one value, one array, nesting, the
arithmetic, and a budget over the whole read). Past a limit the read stops with one line naming it.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

from ..errors import UsageError
from .words import ARRAY_ITEMS, ASSIGN, ArrayWord, Lexer, Part, Shell, Statement, Word

SCRIPT_BYTES = 1 << 20  # a launch script or flags file: a few KB; anything near a megabyte is not one
IF_DEPTH = 64  # ifs open inside one another: a launch script nests one or two
LAUNCHERS = ("torchrun", "python", "python3", "srun", "deepspeed", "mpirun", "accelerate")
_REDIRECT = re.compile(r"[0-9]*(>>?|<)&?")  # 2>&1, > log: where output goes, not a flag


@dataclass
class Script:
    """What a launch script runs: its launcher (torchrun, python -m torch.distributed.run, ...) with the
    launcher's own flags, the training program (pretrain_gpt.py) and the flags given to it."""

    path: str
    launcher: list[str] = field(default_factory=list)
    program: str = ""  # "" for a plain file of flags
    flags: list[str] = field(default_factory=list)
    line: int = 0  # where the launch is
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was not read, one line each


# -- statements -------------------------------------------------------------------------------------------
_BLOCKS = {"for": "done", "while": "done", "until": "done", "case": "esac"}


def read_script(text: str, path: str) -> Script:
    """The launch in `text` (a launch script or a plain file of flags), its variables expanded."""
    script = Script(path)
    shell = Shell(script)
    last_line = 1  # the line of the last statement read
    stack: list[list[bool]] = []  # per open `if`: [this branch runs, a branch has run]
    skipping: list[str] = []  # the closing words of loops being skipped
    launches: list[tuple[int, list[str]]] = []
    loose: list[str] = []  # words of lines that are flags themselves (a flags file)
    for st in Lexer(text, path).statements():
        last_line = st.line
        words = st.words
        head = words[0].literal() if isinstance(words[0], Word) else None
        if skipping:
            if head in _BLOCKS:
                skipping.append(_BLOCKS[head])
            elif head == skipping[-1]:
                skipping.pop()
            continue
        if head in _BLOCKS:
            shell.note(st.line, f"a {head} loop is not run: its lines are skipped")
            skipping.append(_BLOCKS[head])
            continue
        # a frame runs only while the frames around it run, so the innermost says whether a line runs
        active = stack[-1][0] if stack else True
        if head in ("if", "elif", "else", "fi", "then", "do"):
            if head == "if":
                if len(stack) >= IF_DEPTH:
                    raise UsageError(f"{path}: line {st.line}: 'if' nested more than {IF_DEPTH} deep, the limit (a "
                                     "launch script nests one or two)")
                runs = active and _condition(shell, words[1:], st.line)
                stack.append([runs, runs])
            elif not stack:
                raise UsageError(f"{path}: line {st.line}: '{head}' without an 'if'")
            elif head == "fi":
                stack.pop()
            else:
                outer = stack[-2][0] if len(stack) > 1 else True
                frame = stack[-1]
                if head == "elif":
                    frame[0] = outer and not frame[1] and _condition(shell, words[1:], st.line)
                    frame[1] = frame[1] or frame[0]
                elif head == "else":
                    frame[0] = outer and not frame[1]
                    frame[1] = True
                rest = words[1:] if head in ("then", "else", "do") else []
                if rest and isinstance(rest[0], Word) and frame[0]:
                    _command(shell, Statement(st.line, rest), launches, loose)
            continue
        if not active:
            continue
        if head == "exit":
            shell.note(st.line, "the script exits here: nothing after it is read")
            break
        _command(shell, st, launches, loose)
    if stack:
        shell.note(last_line, "an 'if' that never closes with 'fi'")
    if launches:
        if len(launches) > 1:
            shell.note(launches[1][0], f"a second launch (the first, line {launches[0][0]}, is the one read)")
        script.line, words = launches[0]
        at = next(i for i, w in enumerate(words) if w.endswith(".py") and i > 0)
        script.launcher, script.program, script.flags = words[:at], words[at], words[at + 1:]
    elif loose:
        script.flags = loose
    else:
        raise UsageError(f"{path}: no launch of a training program (such as torchrun ... pretrain_gpt.py ...) "
                         "and no --flags: not a Megatron-LM launch script or file of flags")
    return script


def _command(shell: Shell, st: Statement, launches: list, loose: list) -> None:
    words = list(st.words)
    if words and isinstance(words[0], Word) and words[0].literal() in ("export", "declare", "local", "readonly"):
        words = [w for w in words[1:] if not (isinstance(w, Word) and (w.literal() or "").startswith("-"))]
    assigns = []
    while words and (isinstance(words[0], ArrayWord) or _assignment(words[0])):
        assigns.append(words.pop(0))
    if not words:  # only assignments: they set the shell's variables
        for a in assigns:
            _assign(shell, a, st.line)
        return
    cut = next((i for i, w in enumerate(words) if isinstance(w, str)), len(words))  # up to && || |
    expanded: list[str] = []
    noted = len(shell.script.notes)
    for w in words[:cut]:
        if isinstance(w, ArrayWord):
            return
        expanded += shell.fields(w, st.line)
    launch_or_flags = expanded and (expanded[0].startswith("--") or any(w.endswith(".py") for w in expanded[1:]))
    if not launch_or_flags:  # another command (mkdir, echo): what it could not expand does not matter
        del shell.script.notes[noted:]
        return
    kept, skip = [], False
    for f in expanded:  # `2>&1` and `> log` say where output goes: neither is a flag
        m = _REDIRECT.match(f)
        if skip or m:
            skip = m is not None and m.end() == len(f) and not f.endswith("&")
            continue
        kept.append(f)
    expanded = kept
    if not expanded:
        return
    name = expanded[0].rsplit("/", 1)[-1]
    if (name in LAUNCHERS or re.fullmatch(r"python3(\.[0-9]+)?", name)) and \
            any(w.endswith(".py") for w in expanded[1:]):
        launches.append((st.line, expanded))
    elif expanded[0].startswith("--"):
        loose.extend(expanded)


def _assignment(word: object) -> bool:
    if not isinstance(word, Word) or not word.parts or word.parts[0].kind != "uq":
        return False
    return ASSIGN.match(word.parts[0].text) is not None


def _assign(shell: Shell, word: Word | ArrayWord, line: int) -> None:
    if isinstance(word, ArrayWord):
        old = shell.vars.get(word.name, [])
        base = (old if isinstance(old, list) else [old] if old else []) if word.append else []
        items: list[str] = []
        for w in word.items:
            got = shell.fields(w, line)
            if len(base) + len(items) + len(got) > ARRAY_ITEMS:  # counted before the array grows
                raise _too_many(shell, word.name, line)
            items.extend(got)
        if word.append and isinstance(old, list) and word.name in shell.vars:
            old.extend(items)  # in place: a thousand A+=(x) stay a thousand steps, not a million copies
        else:
            shell.vars[word.name] = base + items
        return
    m = ASSIGN.match(word.parts[0].text)
    assert m is not None
    rest = Word([Part(word.parts[0].kind, word.parts[0].text[m.end():])] + word.parts[1:])
    value = shell.joined(rest, line)
    name = m.group(1)
    if m.group(2):
        old = shell.vars.get(name, "")
        if isinstance(old, list):
            if len(old) >= ARRAY_ITEMS:
                raise _too_many(shell, name, line)
            old.append(value)
            return
        value = shell.join([old, value], line)  # its length checked before it is built
    shell.vars[name] = value


def _too_many(shell: Shell, name: str, line: int) -> UsageError:
    return shell.fail(line, f"the array {name} grows past {ARRAY_ITEMS:,} elements, the limit on one array (a "
                            "launch script's arrays hold tens of flags)")


# -- tests in if and elif -------------------------------------------------------------------------------
def _condition(shell: Shell, words: list, line: int) -> bool:
    """`[ ... ]`, `[[ ... ]]` or `test ...` tests joined by && and ||, left to right as bash runs them.
    A file test is taken as true (the script's files exist where it runs); what is not read is noted and
    taken as false."""
    result: bool | None = None
    joiner = None
    group: list = []
    for w in words + ["&&"]:
        if isinstance(w, str) and w in ("&&", "||"):
            value = _test(shell, group, line)
            result = value if result is None else (result and value if joiner == "&&" else result or value)
            joiner, group = w, []
        else:
            group.append(w)
    return bool(result)


def _test(shell: Shell, words: list, line: int) -> bool:
    texts = [w.literal() if isinstance(w, Word) else None for w in words]
    negate = False
    if texts and texts[0] == "!":
        negate, words, texts = True, words[1:], texts[1:]
    if texts and texts[0] in ("[", "[[", "test"):
        closing = {"[": "]", "[[": "]]", "test": None}[texts[0]]
        inner = words[1:-1] if closing and texts[-1] == closing else words[1:]
    else:
        shell.note(line, "a condition that runs a command is not run: taken as false")
        return negate
    args = []
    for w in inner:
        if not isinstance(w, Word):
            shell.note(line, "a condition parasim does not read: taken as false")
            return negate
        args.append(shell.join(shell.fields(w, line), line, " "))
    if args and args[0] == "!":
        negate, args = not negate, args[1:]
    return _compare(shell, args, line) != negate


def _compare(shell: Shell, args: list[str], line: int) -> bool:
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-n", "-z"):
        return (args[1] != "") == (args[0] == "-n")
    if len(args) == 2 and args[0] in ("-f", "-d", "-e", "-r", "-s", "-x"):
        return True
    if len(args) == 3 and args[1] in ("=", "==", "!="):
        return (args[0] == args[2]) == (args[1] != "!=")
    ints = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-gt": operator.gt,
            "-le": operator.le, "-ge": operator.ge}
    if len(args) == 3 and args[1] in ints:
        try:
            return ints[args[1]](int(args[0] or 0), int(args[2] or 0))
        except ValueError:
            pass
    shown = " ".join(a[:60] for a in args[:30])[:60]  # a test's words may be long: only what is shown is joined
    shell.note(line, f"the test [ {shown} ] is not read: taken as false")
    return False


def read_file(path: str) -> Script:
    """The launch script or flags file at `path` (bounded; UTF-8), read."""
    from ..limits import read_bounded
    data = read_bounded(path, "Megatron launch script", SCRIPT_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (not UTF-8): give a launch script or a file of flags") from None
    if "\0" in text:
        raise UsageError(f"{path}: not a text file: give a launch script or a file of flags")
    return read_script(text, path)
