"""One argument style for every command: `key=value`, as `python -m harness` takes its overrides.

`KeyValueCommand` parses `key=value` arguments against a list of options, answers `-h` /
`--help` with one line per option, and turns a mistake into one HarnessError line that names
the fix (a close option name as "did you mean"). Commands that grew up with argparse flags
(`harness.report`, `harness.tracking push`) translate `key=value` into their flags with
`as_flags`, so both spellings work and the help shows `key=value`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.common.errors import HarnessError


@dataclass(frozen=True)
class Option:
    name: str
    help: str  # one line
    default: str | None = None
    required: bool = False


def whole_number(args: dict[str, str], key: str, low: int = 0, why: str = "") -> int:
    """args[key] as an int >= low, else one HarnessError line (ASCII digits only: str.isdigit
    accepts '²', which int() refuses)."""
    text = args[key]
    if not (text.isascii() and text.isdigit()) or int(text) < low:
        raise HarnessError(f"{key}={text!r} must be a whole number >= {low}{f' ({why})' if why else ''}")
    return int(text)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """'; did you mean X?' for the closest choice, '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


@dataclass
class KeyValueCommand:
    prog: str  # e.g. harness-analyze
    summary: str  # one line: what the command does
    options: list[Option]
    example: str = ""

    def help_text(self) -> str:
        width = max(len(o.name) for o in self.options) + 8
        lines = [f"usage: {self.prog} " + " ".join(f"{o.name}=<...>" if o.required else f"[{o.name}=<...>]"
                                                     for o in self.options), "", self.summary, "", "options:"]
        for o in self.options:
            default = " (required)" if o.required else (f" (default: {o.default})" if o.default else "")
            lines.append(f"  {(o.name + '=<...>'):<{width}} {o.help}{default}")
        if self.example:
            lines += ["", f"example: {self.example}"]
        return "\n".join(lines)

    def parse(self, argv: Sequence[str]) -> dict[str, str]:
        """The given options (with defaults filled in); `--help` prints the help and exits 0."""
        if wants_help(argv):
            print(self.help_text())
            raise SystemExit(0)
        names = [o.name for o in self.options]
        args: dict[str, str] = {}
        for arg in argv:
            key, sep, value = arg.lstrip("-").partition("=") if arg.startswith("--") else arg.partition("=")
            key = key.replace("-", "_") if arg.startswith("--") else key
            if not sep:
                raise HarnessError(f"{self.prog}: argument {arg!r} is not key=value; see {self.prog} --help")
            if key not in names:
                raise HarnessError(f"{self.prog}: unknown argument {arg!r}{did_you_mean(key, names)}; "
                                   f"options: {', '.join(names)} (see {self.prog} --help)")
            args[key] = value
        for option in self.options:
            if option.required and option.name not in args:
                raise HarnessError(f"{self.prog}: missing {option.name}=<...> ({option.help}); see {self.prog} --help")
            if option.default is not None:
                args.setdefault(option.name, option.default)
        return args


def as_flags(argv: Sequence[str], flags: dict[str, str], prog: str | None = None) -> list[str]:
    """`key=value` arguments as the argparse flags they stand for (`out=DIR` -> `--out DIR`);
    flags and positional arguments pass unchanged. With `prog`, a `key=value` whose key is
    no option (and that names no existing path) is one HarnessError line with "did you mean",
    instead of a positional argument argparse would take for a directory."""
    out: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not arg.startswith("-") and key in flags:
            out += [flags[key], value]
        elif (prog and sep and not arg.startswith("-") and re.fullmatch(r"[A-Za-z_][\w.-]*", key)
              and not os.path.lexists(arg)):
            raise HarnessError(f"{prog}: unknown argument {arg!r}{did_you_mean(key, flags)}; options: "
                               f"{', '.join(flags)} (see {prog} --help)")
        else:
            out.append(arg)
    return out


def program_name(default: str) -> str:
    """The name the command was started by (a console script's) or the module form."""
    invoked = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else ""
    return invoked if invoked.startswith("harness") and not invoked.endswith(".py") else default
