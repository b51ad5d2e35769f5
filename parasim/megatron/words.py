"""The words of a bash script, as bash reads and expands them (megatron/script.py runs its statements).

`Lexer` cuts the text into statements of words, each word kept as its quoted and unquoted parts (and
`NAME=(...)` arrays whole); `Shell` expands a word with the script's variables: `$NAME`, `${NAME}`,
`${NAME:-default}`, `${ARRAY[@]}`, `$((arithmetic))`, unquoted expansions split on blanks, quoted ones never.
A command substitution `$(...)` is not run: it reads as empty, and the script's notes say so.
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
OPERATORS = ("&&", "||", ";", "|", "&")


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


# -- words ------------------------------------------------------------------------------------------------
class Lexer:
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
            op = next((o for o in OPERATORS if o != ";" and self.s.startswith(o, self.i)), None)
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
                m = ASSIGN.fullmatch(self.s[start:self.i])
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


class Shell:
    def __init__(self, script: Any):  # the Script being read: its path, variables and notes
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
            lexer = Lexer(text, self.script.path)
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
