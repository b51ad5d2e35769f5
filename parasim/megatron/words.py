"""The words of a bash script, as bash reads and expands them (megatron/script.py runs its statements).

`Lexer` cuts the text into statements of words, each word kept as its quoted and unquoted parts (and
`NAME=(...)` arrays whole); `Shell` expands a word with the script's variables: `$NAME`, `${NAME}`,
`${NAME:-default}`, `${ARRAY[@]}`, `$((arithmetic))`, unquoted expansions split on blanks, quoted ones never.
A command substitution, `$(...)` or `` `...` `` (inside double quotes too), is not run: it reads as empty, and
the script's notes say so.

Reading is bounded in size and work, whatever the script: the Lexer reads the text in one pass and never
recurses (runs of plain characters at once, by regular expressions); expansion is held to the limits below,
each checked before the string or list it guards is built, and each refusal is one line naming the limit and
why. The text inside ${A:-${B:-...}} is passed over once more at each level: NESTING levels at most, each pass
paid from the budget, EXPANSION_CHARS, which lives on the Shell (one per script read). Notes need no limit:
each comes from one expression of the text, read once.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import UsageError

# What expanding a script may take. Megatron-LM's launch scripts are a few KB and expand to a few KB more;
# a script that doubles a variable forty times (A="$A$A") would otherwise ask for a terabyte.
VALUE_CHARS = 1 << 20  # one word or variable, expanded: no longer than a whole script may be (SCRIPT_BYTES)
ARRAY_ITEMS = 65_536  # elements of one array: a launch script's arrays hold tens of flags
EXPANSION_CHARS = 32 << 20  # characters expansion reads and builds over the whole read of one script: about
# 32 MB of strings and a second of work at most (a launch script's come to a few KB)
ITEM_CHARS = 32  # what one more word or array element costs beyond its characters: the Python string and the
# list slot that hold it (~57 bytes), so that a million one-letter words are paid for as the memory they take
STEP_CHARS = 32  # what a quote, brace or backslash passed over one at a time costs (a Python step, ~0.5 us): the
# text inside ${A:-${B:-...}} is passed over again at each level
NESTING = 32  # ${...} inside one another's defaults (${A:-${B:-x}}): a script nests one or two; each level is
# one more recursion, and one more pass over the text inside it
ARITH_CHARS = 1_000  # one $((...)) with its variables in place: a launch script's multiplies a few numbers
# (Python's parser, which reads it, recurses once a sign and runs out of memory near 6,000)
ARITH_DEPTH = 32  # parentheses, or signs and operands, inside one another in one $((...)): each is a recursion
ARITH_MAX = 10**15  # any number in $((...)): past it parasim reads 0 and says so (bash wraps at 2**63)

ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
OPERATORS = ("&&", "||", ";", "|", "&")
_PLAIN = re.compile(r"[^ \t\r\n;|&()'\"\\$`]+")  # a run of characters that are the word's text as they are
_DOUBLE_PLAIN = re.compile(r"[^\"\\$`\n]+")  # the same inside "..."
_BLANKS = re.compile(r"(?:[ \t\r]|\\\n)+")  # between words: blanks and continued lines
_DOLLAR_NAME = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
_CLOSE_STOPS = {"{": re.compile(r"['\"`\\{}]"), "(": re.compile(r"['\"`\\()]")}  # what _close looks at
_BACKQUOTE_STOPS = re.compile(r"[\\`]")
_EXPANDS = re.compile(r"[\\$`]")  # where a part's text stops being copied as it is
_FIELD_BLANKS = re.compile(r"[ \t\n]+")  # what an unquoted expansion is split on
_ARITH_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a name bash takes for a variable


@dataclass(slots=True)
class Part:
    kind: str  # "sq": single-quoted, literal; "dq": double-quoted, expanded, never split; "uq": expanded, split
    text: str


@dataclass(slots=True)
class Word:
    parts: list[Part]

    def literal(self) -> str | None:
        """The word's text when it is plain unquoted text (a keyword, a NAME= prefix), else None."""
        if len(self.parts) == 1 and self.parts[0].kind == "uq":
            return self.parts[0].text
        return None


@dataclass(slots=True)
class ArrayWord:
    """`NAME=(...)` or `NAME+=(...)`: an array assignment."""

    name: str
    append: bool
    items: list[Word]


@dataclass(slots=True)
class Statement:
    line: int
    words: list  # Word | ArrayWord | str (an operator: && || |)


def backquote_end(text: str, start: int) -> int:
    """Where the command substitution `...` that opens at `start` ends (just past its closing backquote; a
    backslash escapes the next character), or -1 when it never closes."""
    i = start + 1
    while True:
        m = _BACKQUOTE_STOPS.search(text, i)
        if m is None:
            return -1
        if m.group() == "`":
            return m.end()
        i = m.end() + 1


# -- words ------------------------------------------------------------------------------------------------
class Lexer:
    """The statements of a text, read in one pass: runs of plain characters are taken at once (a regular
    expression), quotes and $-expressions by searching for their end, never by recursion."""

    def __init__(self, text: str, path: str, line: int = 1):
        self.s, self.i, self.line, self.path = text, 0, line, path
        self.in_array = False  # inside NAME=( ... ): a ) ends the word before it
        self.steps = 0  # quotes, braces and backslashes _close has passed over one at a time (the Shell pays)

    def fail(self, what: str) -> UsageError:
        return UsageError(f"{self.path}: line {self.line}: {what}")

    def statements(self) -> Iterator[Statement]:
        """The statements one by one, as they are read (a statement past a limit stops the read there)."""
        current = Statement(self.line, [])
        while True:
            self._blanks()
            if self.i >= len(self.s):
                break
            c = self.s[self.i]
            if c == "\n" or c == ";":
                self.i += 1
                if current.words:
                    yield current
                current = Statement(self.line, [])
                if c == "\n":
                    self.line += 1
                continue
            if c == "#":
                self._comment()
                continue
            if c in "&|":
                op = self.s[self.i : self.i + 2] if self.s[self.i : self.i + 2] in OPERATORS else c
                self.i += len(op)
                current.words.append(op)
                continue
            if not current.words:
                current.line = self.line
            current.words.append(self._word())
        if current.words:
            yield current

    def _blanks(self) -> None:
        m = _BLANKS.match(self.s, self.i)
        if m is not None:
            self.line += m.group().count("\n")  # continued lines
            self.i = m.end()

    def _comment(self) -> None:
        end = self.s.find("\n", self.i)
        self.i = len(self.s) if end < 0 else end

    def _word(self) -> Word | ArrayWord:
        parts: list[tuple[str, list[str]]] = []  # (kind, its texts), joined once the word ends
        s, start = self.s, self.i
        array_tried = False  # a NAME=( is tried at the word's first ( only: after it no prefix is a NAME=
        while self.i < len(s):
            plain = _PLAIN.match(s, self.i)
            if plain is not None:
                self._add(parts, "uq", plain.group())
                self.i = plain.end()
                continue
            c = s[self.i]
            if c == "&" and self.i > start and s[self.i - 1] in "<>":  # 2>&1: a redirection
                self._add(parts, "uq", c)
                self.i += 1
                continue
            if c in " \t\r\n;|&" or (c == ")" and self.in_array):
                break
            if c == "(" and not array_tried:
                array_tried = True
                m = ASSIGN.fullmatch(s, start, self.i)
                if m is not None:
                    if self.in_array:  # refused here, before it nests: A=(B=(C=(... would recurse
                        raise self.fail("an array inside an array, or a ( where a word belongs")
                    self.i += 1
                    self.in_array = True
                    try:
                        return ArrayWord(m.group(1), m.group(2) == "+", self._items())
                    finally:
                        self.in_array = False
            if c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise self.fail("a single quote that never closes")
                self._add(parts, "sq", s[self.i + 1 : end])
                self.line += s.count("\n", self.i, end)
                self.i = end + 1
            elif c == '"':
                self._add(parts, "dq", self._double())
            elif c == "\\":
                if s.startswith("\\\n", self.i):
                    self.i += 2
                    self.line += 1
                else:
                    self._add(parts, "sq", s[self.i + 1 : self.i + 2])
                    self.i += 2
            elif c == "$":
                self._add(parts, "uq", self._dollar())
            elif c == "`":
                self._add(parts, "uq", self._backquoted())
            else:
                self._add(parts, "uq", c)
                self.i += 1
        return Word([Part(kind, "".join(texts)) for kind, texts in parts])

    @staticmethod
    def _add(parts: list[tuple[str, list[str]]], kind: str, text: str) -> None:
        if parts and parts[-1][0] == kind and kind != "dq":
            parts[-1][1].append(text)
        else:
            parts.append((kind, [text]))

    def _double(self) -> str:
        """The inside of "...", its $-expressions and `...` whole (they may hold quotes of their own)."""
        self.i += 1
        out = []
        s = self.s
        while self.i < len(s):
            plain = _DOUBLE_PLAIN.match(s, self.i)
            if plain is not None:
                out.append(plain.group())
                self.i = plain.end()
                continue
            c = s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\" and self.i + 1 < len(s):
                nxt = s[self.i + 1]
                if nxt == "\n":
                    self.line += 1
                else:
                    out.append("\\" + nxt)
                self.i += 2
                continue
            if c == "$":
                out.append(self._dollar())
                continue
            if c == "`":
                out.append(self._backquoted())
                continue
            if c == "\n":
                self.line += 1
            out.append(c)
            self.i += 1
        raise self.fail("a double quote that never closes")

    def _backquoted(self) -> str:
        """A command substitution `...` as written."""
        end = backquote_end(self.s, self.i)
        if end < 0:
            raise self.fail("a backquote ` that never closes")
        start, self.i = self.i, end
        self.line += self.s.count("\n", start, end)
        return self.s[start:end]

    def _dollar(self) -> str:
        """A $-expression as written: $NAME, ${...}, $(...), $((...)), or a lone $."""
        s, i = self.s, self.i
        if s.startswith("${", i):
            end = self._close(i + 2, "{", "}")
        elif s.startswith("$(", i):
            end = self._close(i + 2, "(", ")")
        else:
            m = _DOLLAR_NAME.match(s, i)
            end = m.end() if m else i + 1
        self.line += s.count("\n", i, end)
        self.i = end
        return s[i:end]

    def _close(self, i: int, opening: str, closing: str) -> int:
        """Just past the `closing` that matches an `opening` before `i`, quotes and `...` skipped whole."""
        depth, s = 1, self.s
        skip = i  # what a quote or backslash holds ends here: the stops before it are passed over
        for m in _CLOSE_STOPS[opening].finditer(s, i):  # one pass, in C between the stops
            self.steps += 1
            at = m.start()
            if at < skip:
                continue
            c = m.group()
            if c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    return at + 1
            elif c == "\\":
                skip = at + 2
            else:  # a quote or a backquote: what it holds is passed over whole
                skip = backquote_end(s, at) if c == "`" else s.find(c, at + 1) + 1
                if skip <= 0:
                    break
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
                self._comment()
            else:
                w = self._word()
                if isinstance(w, ArrayWord) or not w.parts:
                    raise self.fail("an array inside an array, or a ( where a word belongs")
                items.append(w)


# -- expansion --------------------------------------------------------------------------------------------
def _divide(a: int, b: int) -> int:
    """a / b as bash divides: toward zero (-7 / 2 is -3; Python's // gives -4)."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _remainder(a: int, b: int) -> int:
    """a % b as bash takes it: the sign of a (-7 % 2 is -1; Python's % gives 1)."""
    return a - b * _divide(a, b)


_ARITH_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: _divide,
    ast.Mod: _remainder,
}


class _Text:
    """A string built from chunks, its length counted as it grows, so that VALUE_CHARS is met before the
    string is built (a doubled variable refers to the same chunk twice: nothing is copied until `done`)."""

    __slots__ = ("shell", "line", "chunks", "size", "quoted")

    def __init__(self, shell: Shell, line: int, quoted: bool = False):
        self.shell, self.line, self.quoted = shell, line, quoted
        self.chunks: list[str] = []
        self.size = 0

    def add(self, text: str) -> None:
        self.size += len(text)
        if self.size > VALUE_CHARS:
            raise self.shell.too_long(self.line)
        self.chunks.append(text)

    def done(self) -> str:
        self.shell.spend(self.size, self.line)
        return "".join(self.chunks)


class Shell:
    """Expansion with the script's variables, within the limits above: `spent` is this read's budget."""

    def __init__(self, script: Any):  # the Script being read: its path, variables and notes
        self.script = script
        self.vars = script.variables
        self.spent = 0  # characters expansion has read and built so far in this read (EXPANSION_CHARS)
        self.depth = 0  # ${...} defaults being expanded inside one another now (NESTING)
        self.unread = set(script.outside)  # variables from outside the script has neither read nor set yet

    def note(self, line: int, what: str) -> None:
        self.script.notes.append(f"line {line}: {what}")

    def fail(self, line: int, what: str) -> UsageError:
        return UsageError(f"{self.script.path}: line {line}: {what}")

    def too_long(self, line: int) -> UsageError:
        return self.fail(
            line,
            f"a value grows past {VALUE_CHARS:,} characters, the limit on one word or variable "
            "(a launch script's are a few KB, and none needs to be longer than a whole script "
            "may be)",
        )

    def spend(self, chars: int, line: int) -> None:
        """`chars` more read or built: refused past EXPANSION_CHARS over the whole read."""
        self.spent += chars
        if self.spent > EXPANSION_CHARS:
            raise self.fail(
                line,
                f"expanding the script reads and builds more than {EXPANSION_CHARS:,} characters, "
                "the limit over the whole read (a launch script's expansions come to a few KB; "
                "this one keeps multiplying its text)",
            )

    def join(self, texts: list[str], line: int, sep: str = "") -> str:
        """`sep.join(texts)`, held to VALUE_CHARS and the budget before it is built."""
        value = _Text(self, line)
        for k, text in enumerate(texts):
            if k:
                value.add(sep)
            value.add(text)
        return value.done()

    def value(self, name: str) -> str | list[str]:
        """What `name` holds ("" when unset); a variable from outside read before the script set it is listed."""
        if name in self.unread:
            self.unread.discard(name)
            self.script.outside_read.append(name)
        return self.vars.get(name, "")

    def assign(self, name: str, value: str | list[str]) -> None:
        """`name` set by the script: from here on its value is the script's, not the one given from outside."""
        self.unread.discard(name)
        self.vars[name] = value

    def pieces(self, text: str, line: int) -> list[str]:
        """`text` (the inside of a word part) with every $-expression and `...` replaced: a list, since
        "${A[@]}" gives one piece per element (the text around it joins the first and the last). The list is
        empty when the text comes to nothing and a ${A[@]} in it had no element while none had one: bash then
        makes no word of "${A[@]}", where "$E" of an empty E (or "${C[@]}" of C=("")) is one empty word."""
        done: list[str] = []
        current = _Text(self, line)
        i = 0
        vanished = listed = False  # a ${A[@]} of no element seen; one of some element seen
        while True:
            m = _EXPANDS.search(text, i)
            end = len(text) if m is None else m.start()
            if end > i:
                current.add(text[i:end])
            if m is None:
                break
            if m.group() == "\\":
                current.add(text[end + 1 : end + 2] or "\\")
                i = end + 2
                continue
            if m.group() == "`":
                stop = backquote_end(text, end)
                i = len(text) if stop < 0 else stop
                expr = text[end:i]
                self.spend(len(expr), line)
                got: str | list[str] = self._substitution(expr, line)
            else:
                lexer = Lexer(text, self.script.path, line)
                lexer.i = end
                expr = lexer._dollar()
                i = lexer.i
                # each level of ${A:-${B:-...}} reads the text inside once more
                self.spend(len(expr) + STEP_CHARS * lexer.steps, line)
                got = self._expand(expr, line)
            if isinstance(got, str):
                current.add(got)
                continue
            if not got:
                vanished = True
                continue
            listed = True
            current.add(got[0])
            if len(got) > 1:
                done.append(current.done())
                done.extend(got[1:-1])
                current = _Text(self, line)
                current.add(got[-1])
        if vanished and not listed and not current.size:
            return []
        done.append(current.done())
        return done

    def _substitution(self, expr: str, line: int) -> str:
        self.note(line, f"{expr[:60]} runs a command: read as empty")
        return ""

    def _expand(self, expr: str, line: int) -> str | list[str]:
        if expr.startswith("$(("):
            return self._arith(expr[3:-2], line)
        if expr.startswith("$("):
            return self._substitution(expr, line)
        if expr.startswith("${"):
            body = expr[2:-1]
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", body)
            if m:
                # a variable set to text is an array of that one element (E= is one empty element); unset, none
                v = self.value(m.group(1))
                items = v if isinstance(v, list) else ([v] if m.group(1) in self.vars else [])
                self.spend(ITEM_CHARS * len(items), line)
                if m.group(2) == "*":  # one text, the elements joined by a space (bash's first IFS character)
                    return self.join(items, line, " ")
                return list(items)
            m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?", body)
            if m:  # ${#A[@]}: how many elements (a set text is one); ${#A}: how long the (first) element is
                v = self.value(m.group(1))
                if m.group(2):
                    return str(len(v) if isinstance(v, list) else int(m.group(1) in self.vars))
                return str(len((v[0] if v else "") if isinstance(v, list) else v))
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
            default = self._default(rest, line)
            if how.endswith("-") or how.endswith("?"):
                return default if unset_or_empty else v
            if how.endswith("="):
                if unset_or_empty:
                    self.assign(name, default)
                    return default
                return v
            return default if not unset_or_empty else ""  # ${X:+word}
        name = expr[1:]
        if name in ("@", "*", "#"):  # the script gets no arguments: $@ no element, "$*" one empty text
            return {"@": [], "*": "", "#": "0"}[name]
        v = self.value(name)
        return (v[0] if v else "") if isinstance(v, list) else v

    def _default(self, rest: str, line: int) -> str:
        """The default of ${X:-rest}, expanded: one level deeper, refused past NESTING."""
        if self.depth >= NESTING:
            raise self.fail(
                line,
                f"${{...}} nested more than {NESTING} deep in one another's defaults, the limit "
                "(a launch script nests one or two; each level is one more recursion)",
            )
        self.depth += 1
        try:
            got = self.pieces(self._unquote(rest), line)
        finally:
            self.depth -= 1
        return self.join(got, line, " ")

    @staticmethod
    def _unquote(text: str) -> str:
        """The default of ${X:-"1"}: its quotes are the shell's, not part of the value."""
        return re.sub(r"""^(["'])(.*)\1$""", r"\2", text, flags=re.S)

    def _arith(self, text: str, line: int) -> str:
        expr = self._arith_text(text, line)
        parentheses = deepest = 0
        for c in expr:  # Python's parser recurses once a parenthesis (and stops at 200): counted first
            parentheses += (c == "(") - (c == ")")
            deepest = max(deepest, parentheses)
        if deepest > ARITH_DEPTH:
            raise self._arith_too_deep(text, line)
        try:
            return str(self._eval(ast.parse(expr.replace("/", "//").strip(), mode="eval").body, text, line, 0))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            self.note(line, f"$(({text.strip()[:50]})) is not arithmetic parasim reads: read as 0")
            return "0"

    def _arith_text(self, text: str, line: int) -> str:
        """`text` with each variable's value in its place (an array's first element; unset or empty: 0), held
        to ARITH_CHARS as it grows."""
        size = len(text)

        def too_long() -> UsageError:
            return self.fail(
                line,
                f"the arithmetic $(({_cut(text)})) comes to more than {ARITH_CHARS:,} characters "
                "with its variables in place, the limit on one arithmetic expression (a launch "
                "script's multiplies a few numbers)",
            )

        def number(m: re.Match, name: str) -> str:
            nonlocal size
            v = self.value(name)
            got = ((v[0] if v else "") if isinstance(v, list) else v) or "0"
            size += len(got) - len(m.group())
            if size > ARITH_CHARS:
                raise too_long()
            return got

        if size > ARITH_CHARS:
            raise too_long()
        self.spend(size, line)
        expr = _ARITH_VARIABLE.sub(lambda m: number(m, m.group(1)), text)
        return NAME.sub(lambda m: number(m, m.group()), expr)

    def _arith_too_deep(self, text: str, line: int) -> UsageError:
        return self.fail(
            line,
            f"the arithmetic $(({_cut(text)})) nests parentheses or signs more than "
            f"{ARITH_DEPTH} deep, the limit (a launch script's nests one or two; each level is "
            "one more recursion)",
        )

    def _eval(self, node: ast.AST, text: str, line: int, depth: int) -> int:
        """The value of `node`, each number and result held to ARITH_MAX. A chain a + b + c nests on its left:
        it is followed in a loop, so that only what nests to the right or under a sign counts to ARITH_DEPTH."""
        if depth > ARITH_DEPTH:
            raise self._arith_too_deep(text, line)
        chain = []
        while isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            chain.append(node)
            node = node.left
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            value = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = -self._eval(node.operand, text, line, depth + 1)
        else:
            raise ValueError("not arithmetic")
        for op in reversed(chain):
            value = _bounded(_ARITH_OPS[type(op.op)](_bounded(value), self._eval(op.right, text, line, depth + 1)))
        return _bounded(value)

    def fields(self, word: Word, line: int) -> list[str]:
        """A word after expansion: unquoted expansions split on blanks; quoted ones never."""
        out: list[str] = []
        field = _Text(self, line)  # the field being built; kept when it holds text or a quoted part
        for part in word.parts:
            if part.kind == "sq":
                field.add(part.text)
                field.quoted = True
                continue
            got = self.pieces(part.text, line)
            if part.kind == "dq":
                if not got:  # "${A[@]}" of no element: no text, and no quoted empty word either
                    continue
                field.add(got[0])
                field.quoted = True
                for g in got[1:]:
                    field = self._keep(out, field, quoted=True)
                    field.add(g)
                continue
            for k, g in enumerate(got):  # as split(" ".join(got)): each piece apart, and split on its blanks
                if k:
                    field = self._keep(out, field)
                start = 0
                for blank in _FIELD_BLANKS.finditer(g):
                    field.add(g[start : blank.start()])
                    field = self._keep(out, field)
                    start = blank.end()
                field.add(g[start:])
        self._keep(out, field)
        return out

    def _keep(self, out: list[str], field: _Text, quoted: bool = False) -> _Text:
        """`field` ended: kept in `out` when it holds text or a quoted part; the next field, begun."""
        if field.size or field.quoted:
            self.spend(ITEM_CHARS, field.line)
            out.append(field.done())
        return _Text(self, field.line, quoted)

    def joined(self, word: Word, line: int) -> str:
        """A word as an assignment's value: expanded, never split."""
        value = _Text(self, line)
        for part in word.parts:
            if part.kind == "sq":
                value.add(part.text)
                continue
            for k, g in enumerate(self.pieces(part.text, line)):
                if k:
                    value.add(" ")
                value.add(g)
        return value.done()


def _cut(text: str, most: int = 20) -> str:
    """`text` as a message shows it: its first `most` characters."""
    text = text.strip()
    return text if len(text) <= most else text[:most] + "..."


def _bounded(n: int) -> int:
    if abs(n) > ARITH_MAX:
        raise ValueError("too large")
    return n
