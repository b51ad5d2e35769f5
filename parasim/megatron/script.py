"""A Megatron-LM launch script read as bash would read it, without running anything.

Launch scripts (Megatron-LM's examples/) set variables and bash arrays, then run one line: `torchrun
<launcher flags> pretrain_gpt.py <training flags>`. This reader follows that much of bash: comments, line
continuations, quotes, `NAME=value`, `NAME=(...)` and `NAME+=(...)`, `export`, `$NAME`, `${NAME}`,
`${NAME:-default}`, `${ARRAY[@]}`, `$((arithmetic))`, and `if`/`elif`/`else`/`fi` over `[ ... ]` and
`[[ ... ]]` tests. It runs no command: a command substitution `$(...)` reads as empty, loops and functions
are skipped, and each such place is noted. The script gets no arguments and no environment, so `$1` is
empty and `${NODES:-1}` takes its default, as a fresh shell would.
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from ..errors import UsageError

SCRIPT_BYTES = 1 << 20  # a launch script or flags file: a few KB; anything near a megabyte is not one
LAUNCHERS = ("torchrun", "python", "python3", "srun", "deepspeed", "mpirun", "accelerate")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_OPERATORS = ("&&", "||", ";", "|", "&")
_REDIRECT = re.compile(r"[0-9]*(>>?|<)&?")  # 2>&1, > log: where output goes, not a flag


@dataclass
class Part:
    kind: str  # "sq": single-quoted, literal; "dq": double-quoted, expanded, never split; "uq": expanded, split
    text: str


@dataclass
class Word:
    parts: list[Part]

    def literal(self) -> str | None:
        """The word's text when it is plain unquoted text (a keyword, a NAME= prefix), else None."""
        if len(self.parts) == 1 and self.parts[0].kind == "uq":
            return self.parts[0].text
        return None


@dataclass
class ArrayWord:
    """`NAME=(...)` or `NAME+=(...)`: an array assignment."""
    name: str
    append: bool
    items: list[Word]


@dataclass
class Statement:
    line: int
    words: list  # Word | ArrayWord | str (an operator: && || |)


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


# -- words ------------------------------------------------------------------------------------------------
class _Lexer:
    def __init__(self, text: str, path: str):
        self.s, self.i, self.line, self.path = text, 0, 1, path
        self.in_array = False  # inside NAME=( ... ): a ) ends the word before it

    def fail(self, what: str) -> UsageError:
        return UsageError(f"{self.path}: line {self.line}: {what}")

    def statements(self) -> list[Statement]:
        out: list[Statement] = []
        current = Statement(self.line, [])
        while True:
            self._blanks()
            if self.i >= len(self.s):
                break
            c = self.s[self.i]
            if c == "\n" or c == ";":
                self.i += 1
                if current.words:
                    out.append(current)
                current = Statement(self.line, [])
                if c == "\n":
                    self.line += 1
                continue
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
                continue
            op = next((o for o in _OPERATORS if o != ";" and self.s.startswith(o, self.i)), None)
            if op is not None:
                self.i += len(op)
                current.words.append(op)
                continue
            if not current.words:
                current.line = self.line
            current.words.append(self._word())
        if current.words:
            out.append(current)
        return out

    def _blanks(self) -> None:
        while self.i < len(self.s):
            if self.s[self.i] in " \t\r":
                self.i += 1
            elif self.s.startswith("\\\n", self.i):  # a continued line
                self.i += 2
                self.line += 1
            else:
                break

    def _word(self) -> Word | ArrayWord:
        parts: list[Part] = []
        start = self.i
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "&" and self.i > start and self.s[self.i - 1] in "<>":  # 2>&1: a redirection
                self._add(parts, "uq", c)
                self.i += 1
                continue
            if c in " \t\r\n;|&" or (c == ")" and self.in_array):
                break
            if c == "(":
                m = _ASSIGN.fullmatch(self.s[start:self.i])
                if m is not None:
                    self.i += 1
                    self.in_array = True
                    try:
                        return ArrayWord(m.group(1), m.group(2) == "+", self._items())
                    finally:
                        self.in_array = False
            if c == "'":
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.fail("a single quote that never closes")
                self._add(parts, "sq", self.s[self.i + 1:end])
                self.line += self.s.count("\n", self.i, end)
                self.i = end + 1
            elif c == '"':
                self._add(parts, "dq", self._double())
            elif c == "\\":
                if self.s.startswith("\\\n", self.i):
                    self.i += 2
                    self.line += 1
                else:
                    self._add(parts, "sq", self.s[self.i + 1:self.i + 2])
                    self.i += 2
            elif c == "$":
                self._add(parts, "uq", self._dollar())
            else:
                self._add(parts, "uq", c)
                self.i += 1
        return Word(parts)

    @staticmethod
    def _add(parts: list[Part], kind: str, text: str) -> None:
        if parts and parts[-1].kind == kind and kind != "dq":
            parts[-1].text += text
        else:
            parts.append(Part(kind, text))

    def _double(self) -> str:
        """The inside of "...", its $-expressions whole (they may hold quotes of their own)."""
        self.i += 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\" and self.i + 1 < len(self.s):
                nxt = self.s[self.i + 1]
                if nxt == "\n":
                    self.line += 1
                else:
                    out.append("\\" + nxt if nxt in '$`"\\' else "\\" + nxt)
                self.i += 2
                continue
            if c == "$":
                out.append(self._dollar())
                continue
            if c == "\n":
                self.line += 1
            out.append(c)
            self.i += 1
        raise self.fail("a double quote that never closes")

    def _dollar(self) -> str:
        """A $-expression as written: $NAME, ${...}, $(...), $((...)), or a lone $."""
        s, i = self.s, self.i
        if s.startswith("${", i):
            end = self._close(i + 2, "{", "}")
        elif s.startswith("$(", i):
            end = self._close(i + 2, "(", ")")
        else:
            m = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])").match(s, i)
            end = m.end() if m else i + 1
        self.line += s.count("\n", i, end)
        self.i = end
        return s[i:end]

    def _close(self, i: int, opening: str, closing: str) -> int:
        depth, s = 1, self.s
        while i < len(s):
            c = s[i]
            if c in "'\"":
                end = s.find(c, i + 1)
                if end < 0:
                    break
                i = end + 1
                continue
            if c == "\\":
                i += 2
                continue
            if c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.fail(f"a '${opening}' that never closes")

    def _items(self) -> list[Word]:
        """The words of an array between ( and ), over as many lines as it takes, comments allowed."""
        items: list[Word] = []
        while True:
            self._blanks()
            if self.i >= len(self.s):
                raise self.fail("an array ( that never closes")
            c = self.s[self.i]
            if c == ")":
                self.i += 1
                return items
            if c == "\n":
                self.line += 1
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                w = self._word()
                if isinstance(w, ArrayWord) or not w.parts:
                    raise self.fail("an array inside an array, or a ( where a word belongs")
                items.append(w)


# -- expansion --------------------------------------------------------------------------------------------
_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class _Shell:
    def __init__(self, script: Script):
        self.script = script
        self.vars = script.variables

    def note(self, line: int, what: str) -> None:
        self.script.notes.append(f"line {line}: {what}")

    def value(self, name: str) -> str | list[str]:
        return self.vars.get(name, "")

    def pieces(self, text: str, line: int) -> list[str]:
        """`text` (the inside of a word part) with every $-expression replaced: a list, since "${A[@]}"
        gives one piece per element (the text around it joins the first and the last)."""
        out = [""]
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text):
                out[-1] += text[i + 1]
                i += 2
                continue
            if c != "$":
                out[-1] += c
                i += 1
                continue
            lexer = _Lexer(text, self.script.path)
            lexer.i = i
            expr = lexer._dollar()
            i = lexer.i
            got = self._expand(expr, line)
            if isinstance(got, list):
                if got:
                    out[-1] += got[0]
                    out.extend(got[1:])
            else:
                out[-1] += got
        return out

    def _expand(self, expr: str, line: int) -> str | list[str]:
        if expr.startswith("$(("):
            return self._arith(expr[3:-2], line)
        if expr.startswith("$("):
            self.note(line, f"{expr[:60]} runs a command: read as empty")
            return ""
        if expr.startswith("${"):
            body = expr[2:-1]
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", body)
            if m:
                v = self.value(m.group(1))
                return list(v) if isinstance(v, list) else ([v] if v else [])
            m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?", body)
            if m:
                v = self.value(m.group(1))
                return str(len(v)) if isinstance(v, list) else str(len(v))
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(:?[-=+?])?(.*)", body, re.S)
            if m is None:
                self.note(line, f"{expr[:60]} is not read: read as empty")
                return ""
            name, how, rest = m.groups()
            v = self.value(name)
            v = v[0] if isinstance(v, list) and v else ("" if isinstance(v, list) else v)
            if how is None:
                if rest:
                    self.note(line, f"{expr[:60]} is not read: read as empty")
                    return ""
                return v
            unset_or_empty = (name not in self.vars) or (how.startswith(":") and not v)
            default = " ".join(self.pieces(self._unquote(rest), line))
            if how.endswith("-") or how.endswith("?"):
                return default if unset_or_empty else v
            if how.endswith("="):
                if unset_or_empty:
                    self.vars[name] = default
                    return default
                return v
            return default if not unset_or_empty else ""  # ${X:+word}
        name = expr[1:]
        if name in ("@", "*", "#"):
            return [] if name != "#" else "0"
        v = self.value(name)
        return (v[0] if v else "") if isinstance(v, list) else v

    @staticmethod
    def _unquote(text: str) -> str:
        """The default of ${X:-"1"}: its quotes are the shell's, not part of the value."""
        return re.sub(r"""^(["'])(.*)\1$""", r"\2", text, flags=re.S)

    def _arith(self, text: str, line: int) -> str:
        expr = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: str(self.value(m.group(1)) or 0), text)
        expr = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: str(self.value(m.group(0)) or 0), expr)
        try:
            return str(self._eval(ast.parse(expr.replace("/", "//").strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            self.note(line, f"$(({text.strip()[:50]})) is not arithmetic parasim reads: read as 0")
            return "0"

    def _eval(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            a, b = self._eval(node.left), self._eval(node.right)
            if abs(a) > 10**15 or abs(b) > 10**15:
                raise ValueError("too large")
            return _ARITH_OPS[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self._eval(node.operand)
        raise ValueError("not arithmetic")

    def fields(self, word: Word, line: int) -> list[str]:
        """A word after expansion: unquoted expansions split on blanks; quoted ones never."""
        out: list[list] = [["", False]]  # [text, holds a quoted part]
        for part in word.parts:
            if part.kind == "sq":
                out[-1][0] += part.text
                out[-1][1] = True
                continue
            got = self.pieces(part.text, line)
            if part.kind == "dq":
                out[-1][0] += got[0]
                out[-1][1] = True
                out.extend([g, True] for g in got[1:])
                continue
            pieces = re.split(r"[ \t\n]+", " ".join(got))
            out[-1][0] += pieces[0]
            out.extend([p, False] for p in pieces[1:])
        return [text for text, quoted in out if text or quoted]

    def joined(self, word: Word, line: int) -> str:
        """A word as an assignment's value: expanded, never split."""
        texts = []
        for part in word.parts:
            texts.append(part.text if part.kind == "sq" else " ".join(self.pieces(part.text, line)))
        return "".join(texts)


# -- statements -------------------------------------------------------------------------------------------
_BLOCKS = {"for": "done", "while": "done", "until": "done", "case": "esac"}


def read_script(text: str, path: str) -> Script:
    """The launch in `text` (a launch script or a plain file of flags), its variables expanded."""
    script = Script(path)
    shell = _Shell(script)
    statements = _Lexer(text, path).statements()
    stack: list[list[bool]] = []  # per open `if`: [this branch runs, a branch has run]
    skipping: list[str] = []  # the closing words of loops being skipped
    launches: list[tuple[int, list[str]]] = []
    loose: list[str] = []  # words of lines that are flags themselves (a flags file)
    for st in statements:
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
        active = all(frame[0] for frame in stack)
        if head in ("if", "elif", "else", "fi", "then", "do"):
            if head == "if":
                runs = active and _condition(shell, words[1:], st.line)
                stack.append([runs, runs])
            elif not stack:
                raise UsageError(f"{path}: line {st.line}: '{head}' without an 'if'")
            elif head == "fi":
                stack.pop()
            else:
                outer = all(frame[0] for frame in stack[:-1])
                frame = stack[-1]
                if head == "elif":
                    frame[0] = outer and not frame[1] and _condition(shell, words[1:], st.line)
                    frame[1] = frame[1] or frame[0]
                elif head == "else":
                    frame[0] = outer and not frame[1]
                    frame[1] = True
                rest = words[1:] if head in ("then", "else", "do") else []
                if rest and isinstance(rest[0], Word) and all(frame[0] for frame in stack):
                    _command(shell, Statement(st.line, rest), launches, loose)
            continue
        if not active:
            continue
        if head == "exit":
            shell.note(st.line, "the script exits here: nothing after it is read")
            break
        _command(shell, st, launches, loose)
    if stack:
        shell.note(statements[-1].line if statements else 1, "an 'if' that never closes with 'fi'")
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


def _command(shell: _Shell, st: Statement, launches: list, loose: list) -> None:
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
    return _ASSIGN.match(word.parts[0].text) is not None


def _assign(shell: _Shell, word: Word | ArrayWord, line: int) -> None:
    if isinstance(word, ArrayWord):
        items = [f for w in word.items for f in shell.fields(w, line)]
        old = shell.vars.get(word.name, [])
        base = (old if isinstance(old, list) else [old] if old else []) if word.append else []
        shell.vars[word.name] = base + items
        return
    m = _ASSIGN.match(word.parts[0].text)
    assert m is not None
    rest = Word([Part(word.parts[0].kind, word.parts[0].text[m.end():])] + word.parts[1:])
    value = shell.joined(rest, line)
    name = m.group(1)
    if m.group(2):
        old = shell.vars.get(name, "")
        if isinstance(old, list):
            shell.vars[name] = old + [value]
            return
        value = old + value
    shell.vars[name] = value


# -- tests in if and elif -------------------------------------------------------------------------------
def _condition(shell: _Shell, words: list, line: int) -> bool:
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


def _test(shell: _Shell, words: list, line: int) -> bool:
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
        got = shell.fields(w, line)
        args.append(" ".join(got))
    if args and args[0] == "!":
        negate, args = not negate, args[1:]
    return _compare(shell, args, line) != negate


def _compare(shell: _Shell, args: list[str], line: int) -> bool:
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
    shell.note(line, f"the test [ {' '.join(args)[:60]} ] is not read: taken as false")
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
