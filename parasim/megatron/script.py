"""A Megatron-LM launch script read as bash would read it, without running anything.

Launch scripts (Megatron-LM's examples/) set variables and bash arrays, then run one line: `torchrun
<launcher flags> pretrain_gpt.py <training flags>`. This reader follows that much of bash: comments, line
continuations, quotes, `NAME=value`, `NAME=(...)` and `NAME+=(...)`, `export`, `$NAME`, `${NAME}`,
`${NAME:-default}`, `${ARRAY[@]}`, `$((arithmetic))`, and `if`/`elif`/`else`/`fi` over `[ ... ]` and
`[[ ... ]]` tests. It runs no command: a command substitution, `$(...)` or `` `...` ``, reads as empty, loops
and functions are skipped, and each such place is noted. The script gets no arguments, so `$1` is empty; it gets
no environment but the variables it is given from outside (`--megatron-env`), so `${NODES:-1}` takes its default
unless NODES is given, as a fresh shell would. The launch may run behind a prefix (uv run, nsys profile, srun,
env, exec, numactl: the table PREFIXES), whose own words are passed over to find the launcher.

Every script is read in bounded time and memory: the script itself is at most SCRIPT_BYTES, `if`s nest at most
IF_DEPTH deep, and expansion is held to the limits of megatron/words.py (one value, one array, nesting, the
arithmetic, and a budget over the whole read). Past a limit the read stops with one line naming it.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

from ..errors import UsageError
from ..limits import brief
from .words import ARRAY_ITEMS, ASSIGN, ITEM_CHARS, NAME, VALUE_CHARS, ArrayWord, Lexer, Part, Shell, Statement, Word

SCRIPT_BYTES = 1 << 20  # a launch script or flags file: a few KB; anything near a megabyte is not one
OUTSIDE_CHARS = SCRIPT_BYTES  # the variables given from outside, names and values together (each counted
# ITEM_CHARS more): no more than a whole script may be; a shell's environment is a few KB
IF_DEPTH = 64  # ifs open inside one another: a launch script nests one or two
LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "mpirun", "accelerate")
_REDIRECT = re.compile(r"[0-9]*(>>?|<)&?")  # 2>&1, > log: where output goes, not a flag
_OPTION = re.compile(r"-[^0-9]")  # an option's word (-n, --nodes), not a negative number
_SAYS = ("echo", "printf")  # commands that print a launch's words, never run them


@dataclass(frozen=True)
class Prefix:
    """A command that runs the launch after its own words, which are passed over to find the launcher.
    `then`: the word that must follow it (uv run, nsys profile), else it is not read as a prefix. `valued`:
    its options that take the next word as their value (`-a NAME`), or None when every option does but the
    `switches`. An option's value may also follow `=` (`--nodes=2`), or a one-letter option's letter (`-N2`).
    `assigns`: it takes NAME=VALUE words before the command (env), the launch's environment."""

    then: str = ""
    valued: frozenset[str] | None = frozenset()
    switches: frozenset[str] = frozenset()
    assigns: bool = False

    def read(self, words: list[str], start: int) -> tuple[int, dict[str, str], dict[str, str]] | None:
        """Its own words from `start` (just past its name): where the command it runs begins, its options
        (name -> value, "" for a switch; the last wins) and its NAME=VALUE words. None when `then` is not there
        (`uv pip ...` runs no launch)."""
        i = start
        if self.then:
            if i >= len(words) or words[i] != self.then:
                return None
            i += 1
        options: dict[str, str] = {}
        environment: dict[str, str] = {}
        while i < len(words):
            w = words[i]
            if w == "--":  # the end of its options
                return i + 1, options, environment
            if self.assigns and "=" in w and NAME.fullmatch(w.split("=", 1)[0]):
                name, _, value = w.partition("=")
                environment[name] = value
                i += 1
                continue
            if not w.startswith("-") or w == "-":
                break
            i += 1
            name, eq, value = w.partition("=")
            if not eq and not name.startswith("--") and len(name) > 2:  # -N2: the value follows the letter
                name, eq, value = name[:2], "=", name[2:]
            if not eq and self._takes_value(name):
                if i < len(words) and not _OPTION.match(words[i]):
                    value = words[i]
                    i += 1
                else:  # an option next, or nothing: the value was an unset variable (-N $UNSET -n 4)
                    value = ""
            options[name] = value
        return i, options, environment

    def _takes_value(self, option: str) -> bool:
        return option not in self.switches if self.valued is None else option in self.valued


# The commands a launch may run behind, by name (a path's last part): one entry each. Their options are the
# tools' own (uv run --help, nsys profile --help, srun's and numactl's manuals, env --help, bash's exec).
PREFIXES: dict[str, Prefix] = {
    "uv": Prefix(
        then="run",
        valued=frozenset(
            {
                "--with",
                "-w",
                "--with-editable",
                "--with-requirements",
                "--python",
                "-p",
                "--project",
                "--directory",
                "--env-file",
                "--extra",
                "--no-extra",
                "--group",
                "--no-group",
                "--only-group",
                "--package",
                "--index",
                "--default-index",
                "--index-url",
                "-i",
                "--extra-index-url",
                "--find-links",
                "-f",
                "--config-file",
                "--cache-dir",
                "--color",
                "--index-strategy",
                "--keyring-provider",
                "--resolution",
                "--prerelease",
                "--exclude-newer",
                "--link-mode",
                "--allow-insecure-host",
                "--upgrade-package",
                "-P",
                "--reinstall-package",
                "--refresh-package",
                "--no-build-package",
                "--no-binary-package",
                "--config-setting",
                "-C",
                "--no-build-isolation-package",
                "--python-platform",
            }
        ),
    ),
    "nsys": Prefix(then="profile", valued=None, switches=frozenset({"-h", "--help"})),  # -o x, --trace cuda
    "srun": Prefix(
        valued=None,
        switches=frozenset(
            {  # -N 2, --ntasks-per-node 8: the rest take a value
                "-l",
                "--label",
                "-u",
                "--unbuffered",
                "-K",
                "--kill-on-bad-exit",
                "-k",
                "--no-kill",
                "-O",
                "--overcommit",
                "-Q",
                "--quiet",
                "-v",
                "--verbose",
                "-X",
                "--disable-status",
                "-Z",
                "--no-allocate",
                "-E",
                "--preserve-env",
                "-H",
                "--hold",
                "-I",
                "--immediate",
                "-s",
                "--oversubscribe",
                "--exclusive",
                "--pty",
                "--contiguous",
                "--overlap",
                "--multi-prog",
                "--spread-job",
                "--test-only",
                "--container-writable",
                "--container-mount-home",
                "--no-container-mount-home",
                "--container-remap-root",
                "--no-container-remap-root",
                "--no-container-entrypoint",
                "--container-entrypoint-log",
                "-h",
                "--help",
            }
        ),
    ),
    "env": Prefix(valued=frozenset({"-u", "--unset", "-C", "--chdir"}), assigns=True),
    "exec": Prefix(valued=frozenset({"-a"})),
    "numactl": Prefix(
        valued=None,
        switches=frozenset(
            {  # --cpunodebind=0, -N 0, -m 0: the rest take a value
                "-l",
                "--localalloc",
                "-a",
                "--all",
                "-b",
                "--balancing",
                "-u",
                "--huge",
                "-T",
                "--touch",
                "-t",
                "--strict",
                "-s",
                "--show",
                "-H",
                "--hardware",
            }
        ),
    ),
    "nohup": Prefix(),
    "time": Prefix(valued=frozenset()),  # bash's `time -p`: a switch
}


@dataclass
class Script:
    """What a launch script runs: its launcher (torchrun, python -m torch.distributed.run, ...) with the
    launcher's own flags, the training program (pretrain_gpt.py) and the flags given to it."""

    path: str
    launcher: list[str] = field(default_factory=list)
    program: str = ""  # "" for a plain file of flags
    flags: list[str] = field(default_factory=list)
    line: int = 0  # where the launch is
    prefixes: list[list[str]] = field(default_factory=list)  # what runs the launcher (uv run, srun -N 2), in order
    environment: dict[str, str] = field(default_factory=dict)  # NAME=VALUE the launch line gives its command
    variables: dict[str, str | list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was not read, one line each
    outside: dict[str, str] = field(default_factory=dict)  # variables given from outside (--megatron-env)
    outside_read: list[str] = field(default_factory=list)  # those the script read before setting them itself

    def prefix_options(self, name: str) -> dict[str, str] | None:
        """The options of the prefix `name` (srun) the launch runs behind, by the table; None when it has none."""
        for words in self.prefixes:
            if words[0].rsplit("/", 1)[-1] == name:
                got = PREFIXES[name].read(words, 1)
                return got[1] if got is not None else None
        return None


# -- statements -------------------------------------------------------------------------------------------
_BLOCKS = {"for": "done", "while": "done", "until": "done", "case": "esac"}


def read_script(text: str, path: str, outside: dict[str, str] | None = None) -> Script:
    """The launch in `text` (a launch script or a plain file of flags), its variables expanded; `outside`:
    variables set before it runs (as exported ones are), which its own assignments replace."""
    script = Script(path, outside=check_outside(outside or {}, path))
    script.variables.update(script.outside)
    shell = Shell(script)
    last_line = 1  # the line of the last statement read
    stack: list[list[bool]] = []  # per open `if`: [this branch runs, a branch has run]
    skipping: list[str] = []  # the closing words of loops being skipped
    launches: list[Launch] = []
    hidden: list[str] = []  # launches behind a command not in PREFIXES, one line each
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
                    raise UsageError(
                        f"{path}: line {st.line}: 'if' nested more than {IF_DEPTH} deep, the limit (a "
                        "launch script nests one or two)"
                    )
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
                if rest and isinstance(rest[0], (Word, ArrayWord)) and frame[0]:  # then X=(...) on its line
                    _command(shell, Statement(st.line, rest), launches, hidden, loose)
            continue
        if not active:
            continue
        if head == "exit":
            shell.note(st.line, "the script exits here: nothing after it is read")
            break
        _command(shell, st, launches, hidden, loose)
    if stack:
        shell.note(last_line, "an 'if' that never closes with 'fi'")
    if launches:
        if len(launches) > 1:
            shell.note(launches[1].line, f"a second launch (the first, line {launches[0].line}, is the one read)")
        script.notes += hidden
        first = launches[0]
        words = first.words
        at = next(i for i, w in enumerate(words) if w.endswith(".py") and i > 0)
        script.launcher, script.program, script.flags = words[:at], words[at], words[at + 1 :]
        script.line, script.prefixes, script.environment = first.line, first.prefixes, first.environment
    elif hidden:
        raise UsageError(f"{path}: {hidden[0]}")
    elif loose:
        script.flags = loose
    else:
        raise UsageError(
            f"{path}: no launch of a training program (such as torchrun ... pretrain_gpt.py ...) "
            "and no --flags: not a Megatron-LM launch script or file of flags"
        )
    return script


@dataclass
class Launch:
    """A line that launches a training program: its launcher's words (torchrun ... pretrain_gpt.py ...), what
    runs the launcher (uv run, srun -N 2), and the environment the line gives it."""

    line: int
    words: list[str]
    prefixes: list[list[str]]
    environment: dict[str, str]


def _is_launcher(word: str) -> bool:
    name = word.rsplit("/", 1)[-1]
    return name in LAUNCHERS or re.fullmatch(r"python3(\.[0-9]+)?", name) is not None


def _behind_prefixes(words: list[str]) -> tuple[list[list[str]], dict[str, str], list[str]]:
    """`words` without the prefixes in front (uv run, srun -N 2, env X=1): their words, one list each, the
    environment they give (env's NAME=VALUE), and the command they run."""
    prefixes: list[list[str]] = []
    environment: dict[str, str] = {}
    i = 0
    while i < len(words):
        prefix = PREFIXES.get(words[i].rsplit("/", 1)[-1])
        got = prefix.read(words, i + 1) if prefix is not None else None
        if got is None:
            break
        end, _, given = got
        prefixes.append(words[i:end])
        environment.update(given)
        i = end
    return prefixes, environment, words[i:]


def _command(shell: Shell, st: Statement, launches: list[Launch], hidden: list[str], loose: list[str]) -> None:
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
    prefixes, environment, command = _behind_prefixes(expanded)
    if command and _is_launcher(command[0]) and any(w.endswith(".py") for w in command[1:]):
        given = {}  # NAME=value before the command (X=1 torchrun ...): its environment, not the script's
        for a in assigns:
            if isinstance(a, Word):
                name, _, rest = _parts(a)
                given[name] = shell.joined(rest, st.line)
        launches.append(Launch(st.line, command, prefixes, {**given, **environment}))
        return
    behind = next((w for w in command[1:] if _is_launcher(w)), None)
    if behind is not None and command[0] not in _SAYS and any(w.endswith(".py") for w in command[2:]):
        known = ", ".join(f"{k} {p.then}".rstrip() for k, p in PREFIXES.items())
        hidden.append(
            f"line {st.line}: {behind.rsplit('/', 1)[-1][:40]} runs behind {command[0][:40]}, a command "
            f"parasim does not read its way past (it knows {known}): this launch is not read"
        )
    elif expanded[0].startswith("--"):
        loose.extend(expanded)


def _assignment(word: object) -> bool:
    if not isinstance(word, Word) or not word.parts or word.parts[0].kind != "uq":
        return False
    return ASSIGN.match(word.parts[0].text) is not None


def _parts(word: Word) -> tuple[str, bool, Word]:
    """An assignment word NAME=value (or NAME+=value): the name, whether it appends, and the value's word."""
    m = ASSIGN.match(word.parts[0].text)
    assert m is not None
    return (
        m.group(1),
        bool(m.group(2)),
        Word([Part(word.parts[0].kind, word.parts[0].text[m.end() :])] + word.parts[1:]),
    )


def _assign(shell: Shell, word: Word | ArrayWord, line: int) -> None:
    if isinstance(word, ArrayWord):
        old = shell.value(word.name) if word.append else []
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
            shell.assign(word.name, base + items)
        return
    name, append, rest = _parts(word)
    value = shell.joined(rest, line)
    if append:
        old = shell.value(name)
        if isinstance(old, list):
            if len(old) >= ARRAY_ITEMS:
                raise _too_many(shell, name, line)
            old.append(value)
            return
        value = shell.join([old, value], line)  # its length checked before it is built
    shell.assign(name, value)


def check_outside(outside: dict[str, str], path: str) -> dict[str, str]:
    """`outside` (variables given from outside), checked as bash would take them and held to the limits: each
    name one bash takes, each value at most VALUE_CHARS, all of them at most OUTSIDE_CHARS."""
    total = 0
    for name, value in outside.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise UsageError(
                f"{path}: the variable {brief(name)} from outside is not a name bash takes (letters, "
                "digits and _, not starting with a digit)"
            )
        if not isinstance(value, str) or len(value) > VALUE_CHARS:
            raise UsageError(
                f"{path}: the variable {name[:40]} from outside is longer than {VALUE_CHARS:,} "
                "characters, the limit on one word or variable"
            )
        total += len(name) + len(value) + ITEM_CHARS
        if total > OUTSIDE_CHARS:
            raise UsageError(
                f"{path}: the variables from outside come to more than {OUTSIDE_CHARS:,} characters, "
                "the limit (as much as a whole script may be; a shell's environment is a few KB)"
            )
    return dict(outside)


def _too_many(shell: Shell, name: str, line: int) -> UsageError:
    return shell.fail(
        line,
        f"the array {name} grows past {ARRAY_ITEMS:,} elements, the limit on one array (a "
        "launch script's arrays hold tens of flags)",
    )


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
    ints = {
        "-eq": operator.eq,
        "-ne": operator.ne,
        "-lt": operator.lt,
        "-gt": operator.gt,
        "-le": operator.le,
        "-ge": operator.ge,
    }
    if len(args) == 3 and args[1] in ints:
        try:
            return ints[args[1]](int(args[0] or 0), int(args[2] or 0))
        except ValueError:
            pass
    shown = " ".join(a[:60] for a in args[:30])[:60]  # a test's words may be long: only what is shown is joined
    shell.note(line, f"the test [ {shown} ] is not read: taken as false")
    return False


def read_file(path: str, outside: dict[str, str] | None = None) -> Script:
    """The launch script or flags file at `path` (bounded; UTF-8), read with the variables `outside`."""
    from ..limits import read_bounded

    data = read_bounded(path, "Megatron launch script", SCRIPT_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (not UTF-8): give a launch script or a file of flags") from None
    if "\0" in text:
        raise UsageError(f"{path}: not a text file: give a launch script or a file of flags")
    return read_script(text, path, outside)
