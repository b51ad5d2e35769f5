"""`parasim --completion bash|zsh`: a shell completion script made from the parsers themselves, so every
command, flag and choice parasim has is completed and a new one needs no edit here. Commands, then each
command's flags; a flag's choices after it; lesson names where a command takes a lesson; file names wherever
a flag takes a value without choices (bash's default completion). zsh runs the bash script through its
bashcompinit."""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh")
LESSON_METAVARS = ("NAME", "LESSON")  # a positional that names a lesson (lesson, run, check, compare, serve)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser, lessons: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """A parser's flags; each flag that takes a value with what completes it (its choices; [] for a file or
    a number); and what completes its positional words (a subcommand's names, choices, lesson names)."""
    flags: list[str] = []
    values: dict[str, list[str]] = {}
    positional: list[str] = []
    for action in parser._actions:
        if action.option_strings:
            flags += action.option_strings
            if action.nargs != 0:
                for option in action.option_strings:
                    values[option] = [str(c) for c in action.choices] if action.choices else []
        elif isinstance(action, argparse._SubParsersAction):
            positional += list(action.choices)
        elif action.choices:
            positional += [str(c) for c in action.choices]
        elif action.metavar in LESSON_METAVARS:
            positional += lessons
    return flags, values, positional


def _quote(words: list[str]) -> str:
    return " ".join(w for w in words if w.replace("-", "").replace("_", "").replace(".", "").isalnum())


def bash_script(parser: argparse.ArgumentParser, lessons: list[str]) -> str:
    """The bash completion function for `parasim` and the `complete` line that binds it."""
    flags, values, commands = _words(parser, lessons)
    lines = [
        "# parasim's completion for bash: `parasim --completion bash > ~/.parasim-completion.bash`, then source it",
        "_parasim() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
        "    done",
        '    case "$cmd" in',
    ]

    def branch(name: str, flags_: list[str], values_: dict[str, list[str]], positional: list[str]) -> None:
        lines.append(f'    "{name}")')
        lines.append('        case "$prev" in')
        by_words: dict[str, list[str]] = {}
        for option, choices in values_.items():
            by_words.setdefault(_quote(choices), []).append(option)
        for words, options in by_words.items():
            reply = f'COMPREPLY=($(compgen -W "{words}" -- "$cur"))' if words else "COMPREPLY=()"
            lines.append(f"            {'|'.join(options)}) {reply}; return ;;")
        lines.append("        esac")
        lines.append(f'        COMPREPLY=($(compgen -W "{_quote(flags_ + positional)}" -- "$cur")) ;;')

    branch("", flags, values, commands)
    for name, sub in _subcommands(parser).items():
        branch(name, *_words(sub, lessons))
    lines += ["    esac", "}", "complete -o default -F _parasim parasim", ""]
    return "\n".join(lines)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The script for `shell` (bash or zsh)."""
    from ..lesson import load_lessons

    script = bash_script(parser, sorted(load_lessons()))
    if shell == "zsh":
        return (
            "# parasim's completion for zsh (bash's, through zsh's bashcompinit): source it from ~/.zshrc\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + script
        )
    return script


class CompletionAction(argparse.Action):
    """`--completion SHELL`: print the script and exit 0, as --version prints and exits."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        import sys

        sys.stdout.write(completion_script(parser, str(values)))
        parser.exit(0)
