"""What a command runs besides itself: the command a wrapper starts, the script a shell is given, and what hides it.

`look_inside(words, stdin)` reads a simple command's words (and what its stdin is) and gives the commands or
shell texts it runs, with the reasons part of it cannot be seen. Options are skipped by small tables (`_Options`):
enough of each command's syntax to find the command it runs, including the options that take a value
(`sudo -u root rm` runs `rm`, not `root`). An option a table does not know is taken to have no value.

- Wrappers: `env` (its `NAME=value` words become assignments of the inner command; `-C DIR` its directory),
  `sudo` (`-D DIR` too; with `-e`, `-l`, `-v`, `-V` or `-K` nothing runs), `doas`, `pkexec`, `nohup`, `setsid`,
  `nice`, `ionice`, `stdbuf`, `timeout` (after its duration), `chroot` (after its new root), `command` (not with
  `-v`/`-V`), `builtin`, `exec`, `time` and `xargs` (whose command gets arguments only known at run time).
  `busybox` (its applet is the command).
- Shell text: `sh`, `bash`, `zsh`, `dash`, `ksh`, `mksh`, `ash`, `fish` with `-c`; `su -c`; `eval` of its
  words; `trap 'text' SIGNAL`; a shell (or `sudo -s`, `su`) reading a here-document or here-string.
- `find … -exec|-execdir|-ok|-okdir CMD … ;|+`: CMD, whose `{}` stands for paths under find's starting points.
- Opaque: a shell or interpreter (`python*`, `pypy*`, `perl`, `ruby`, `node`, `php`, `lua`) reading its program
  from a pipe, a file, `-s`, `-` or a process substitution; a program text (`bash -c`, `eval`, a here-document)
  built from expansions; an interpreter's inline program (`python3 -c`, `perl -e`, a here-document given to
  `python3`), whose language the policy does not read; `source`/`.` of a file; `env -S`, which splits its own
  command line.
- Input readers (`Stdin.terminal`: the command was started with stdin or a pty, for terminal_input): a shell,
  `su`, `sudo -s|-i`, `doas -s`, `chroot` without a command, or an interpreter, reading its commands from that
  input, and the programs in `_READERS` (REPLs such as `psql`, and what opens a shell: `ssh`, `script`, `tmux`, …)
  given such an input. They are opaque (what they run is typed later) and listed in `Inside.readers`, so that what
  is typed into them is decided as a command (evaluate.py).

A script run by its file name (`bash deploy.sh`, `python3 x.py`, `python3 -m pytest`, `./x`) is a program like any
other, not opaque. Not seen through (their commands are only their own words): `watch`, `flock`, `ssh`,
`runuser`, `unshare`, `nsenter`, `systemd-run`, `firejail`, `strace`, `make` recipes, `git` aliases and hooks.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, replace

from mcpserver.policy.commands import InputReader, Redirect

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish"})
# Wrappers that change who runs the command, or where: a decision of their own, not only the inner command's.
PRIVILEGED = frozenset({"sudo", "doas", "pkexec", "su", "chroot"})
# Programs that, given an open input, run what is typed into it: REPLs (False: not shell text) and programs that
# open a shell (True). Cheap to list; a program not listed that does the same is not seen (a guardrail, not a wall).
_READERS = {
    **dict.fromkeys(("irb", "psql", "mysql", "mariadb", "sqlite3", "gdb", "tclsh", "expect"), False),
    **dict.fromkeys(("ssh", "script", "tmux", "screen", "unshare", "nsenter", "newgrp", "sg", "login"), True),
}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_INTERPRETER = re.compile(r"(?:python|pypy)[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|php[0-9.]*|lua[0-9.]*")
_STDIN_FILES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})


@dataclass(frozen=True)
class Word:
    text: str
    dynamic: bool = False  # holds a parameter expansion or a substitution
    substituted: bool = False  # holds a process substitution (`<(…)`)


@dataclass(frozen=True)
class Stdin:
    """Where a command's standard input comes from, as far as the text shows."""

    piped: bool = False  # a later stage of a pipeline
    source: Redirect | None = None  # the last redirection feeding it, which wins over a pipe
    terminal: bool = False  # else: the input the command was started with, which terminal_input types into


@dataclass(frozen=True)
class Inner:
    """Something a command runs: another simple command (`words`) or shell text (`script`)."""

    words: tuple[Word, ...] = ()
    assignments: tuple[str, ...] = ()
    script: str | None = None
    script_from_stdin: bool = False  # the script is what feeds stdin: its commands do not read it again
    chdir: tuple[str | None, ...] = ()  # directories the inner command runs in (None: unknown)
    more_args_unknown: bool = False
    placeholder_under: tuple[str, ...] = ()


@dataclass
class Inside:
    inners: list[Inner] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    transparent: bool = True  # the command adds nothing to what it runs (not so for sudo: it changes the user)
    readers: list[InputReader] = field(default_factory=list)


@dataclass(frozen=True)
class _Options:
    """How a command's options are read, enough to find where its command or operands start."""

    takes_value: str = ""  # short options followed by a value, attached or in the next word
    attached_value: str = ""  # short options whose optional value can only be attached (xargs -i, -l, -e)
    long_takes_value: frozenset[str] = frozenset()
    operands: int = 0  # operands before the command (timeout's DURATION, chroot's NEWROOT)
    assignments: bool = False  # NAME=value words before the command (env, sudo)
    chdir: tuple[str, ...] = ()  # options naming the directory the command runs in
    no_command: str = ""  # short options with which nothing runs (`sudo -l`, `command -v`)
    long_no_command: frozenset[str] = frozenset()
    shell: str = ""  # short options that start a shell reading stdin when no command follows (`sudo -s`)
    dash_is_option: bool = False  # `env -` is `env -i`, `su -` is `su -l`
    plus: bool = False  # `+o` options (shells)
    permute: bool = False  # options may follow operands (GNU getopt: `su root -c cmd`)


_WRAPPERS: dict[str, _Options] = {
    "env": _Options(
        takes_value="uCS",
        long_takes_value=frozenset({"unset", "chdir", "split-string"}),
        assignments=True,
        chdir=("C", "chdir"),
        dash_is_option=True,
    ),
    "sudo": _Options(
        takes_value="ugCDhprtUTc",
        long_takes_value=frozenset(
            {"user", "group", "close-from", "chdir", "host", "prompt", "role", "type", "other-user"}
            | {"command-timeout", "login-class"}
        ),
        assignments=True,
        chdir=("D", "chdir"),
        no_command="elvVK",
        long_no_command=frozenset({"edit", "list", "validate", "version", "remove-timestamp"}),
        shell="si",
    ),
    "doas": _Options(takes_value="uC", no_command="C", shell="s"),
    "pkexec": _Options(long_takes_value=frozenset({"user"})),
    "nohup": _Options(),
    "setsid": _Options(),
    "nice": _Options(takes_value="n", long_takes_value=frozenset({"adjustment"})),
    "ionice": _Options(takes_value="cnpPu", long_takes_value=frozenset({"class", "classdata", "pid", "pgid", "uid"})),
    "stdbuf": _Options(takes_value="ioe", long_takes_value=frozenset({"input", "output", "error"})),
    "timeout": _Options(takes_value="sk", long_takes_value=frozenset({"signal", "kill-after"}), operands=1),
    "chroot": _Options(long_takes_value=frozenset({"userspec", "groups"}), operands=1),
    "command": _Options(no_command="vV"),
    "builtin": _Options(),
    "exec": _Options(takes_value="a"),
    "time": _Options(takes_value="fo", long_takes_value=frozenset({"format", "output"})),
    "busybox": _Options(long_no_command=frozenset({"list", "list-full", "install", "help"})),
    "xargs": _Options(
        takes_value="ILnPsdEa",
        attached_value="ile",
        long_takes_value=frozenset({"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"}),
    ),
}
_SHELL_OPTIONS = _Options(takes_value="oO", long_takes_value=frozenset({"rcfile", "init-file"}), plus=True)
_SU_OPTIONS = _Options(
    takes_value="csgGw",
    long_takes_value=frozenset({"command", "session-command", "shell", "group", "supp-group", "whitelist-environment"}),
    dash_is_option=True,
    permute=True,
)


@dataclass(frozen=True)
class _Interpreter:
    options: _Options
    inline: tuple[str, ...]  # options giving the program inline (`-c`, `-e`, `--eval`)
    named: tuple[str, ...] = ()  # options naming the program to run (`python -m pytest`)
    interactive: tuple[str, ...] = ()  # options reading more program from the input after it (`python -i`)


_INTERPRETERS: dict[str, _Interpreter] = {
    "python": _Interpreter(_Options(takes_value="cmWX"), ("c",), ("m",), ("i",)),
    "pypy": _Interpreter(_Options(takes_value="cmWX"), ("c",), ("m",), ("i",)),
    "perl": _Interpreter(_Options(takes_value="eE", attached_value="IMm0lixdDC"), ("e", "E")),
    "ruby": _Interpreter(_Options(takes_value="eIr"), ("e",)),
    "node": _Interpreter(
        _Options(takes_value="epr", long_takes_value=frozenset({"eval", "print", "require", "import", "input-type"})),
        ("e", "p", "eval", "print"),
        interactive=("i", "interactive"),
    ),
    "php": _Interpreter(_Options(takes_value="rcdz"), ("r",), interactive=("a",)),
    "lua": _Interpreter(_Options(takes_value="el"), ("e",), interactive=("i",)),
}


@dataclass
class _Scan:
    """A command's options as `_scan` read them: the index of the first operand, the options, their values."""

    index: int = 1
    short: set[str] = field(default_factory=set)
    long: set[str] = field(default_factory=set)
    values: dict[str, Word] = field(default_factory=dict)


def _scan(words: tuple[Word, ...], spec: _Options) -> _Scan:
    scan = _Scan()
    while scan.index < len(words):
        text = words[scan.index].text
        if text == "--":
            scan.index += 1
            break
        if text == "-" and spec.dash_is_option:
            scan.short.add("-")
        elif text.startswith("--"):
            _long_option(words, scan, spec)
        elif len(text) > 1 and (text[0] == "-" or (spec.plus and text[0] == "+")):
            _short_options(words, scan, spec)
        elif not spec.permute:
            break
        scan.index += 1
    return scan


def _long_option(words: tuple[Word, ...], scan: _Scan, spec: _Options) -> None:
    word = words[scan.index]
    name, equals, value = word.text[2:].partition("=")
    scan.long.add(name)
    if equals:
        scan.values[name] = replace(word, text=value)
    elif name in spec.long_takes_value and scan.index + 1 < len(words):
        scan.index += 1
        scan.values[name] = words[scan.index]


def _short_options(words: tuple[Word, ...], scan: _Scan, spec: _Options) -> None:
    word = words[scan.index]
    for at, letter in enumerate(word.text[1:], start=1):
        scan.short.add(letter)
        rest = word.text[at + 1 :]
        if letter in spec.attached_value:
            scan.values[letter] = replace(word, text=rest)
            return
        if letter in spec.takes_value:
            if rest:
                scan.values[letter] = replace(word, text=rest)
            elif scan.index + 1 < len(words):
                scan.index += 1
                scan.values[letter] = words[scan.index]
            return


def look_inside(words: tuple[Word, ...], stdin: Stdin) -> Inside:
    """What the command of `words` (whose name is literal) runs besides itself, and what of it cannot be seen."""
    name = posixpath.basename(words[0].text)
    inside = Inside(transparent=name not in PRIVILEGED)
    if name in SHELLS:
        _shell(name, words, stdin, inside)
    elif _INTERPRETER.fullmatch(name):
        _interpreter(name, words, stdin, inside)
    elif name in _WRAPPERS:
        _wrapper(name, words, stdin, inside)
    elif name == "su":
        _su(words, stdin, inside)
    elif name == "eval" and len(words) > 1:
        _code("`eval`", words[1:], inside)
    elif name in ("source", ".") and len(words) > 1:
        inside.reasons.append(f"`{name}` runs the file {words[1].text!r}, which is not inspected")
    elif name == "trap":
        _trap(words, inside)
    elif name == "find":
        _find(words, inside)
    elif name in _READERS and _reads_terminal(stdin):
        _reader(name, _READERS[name], inside)
    return inside


def _reads_terminal(stdin: Stdin) -> bool:
    return stdin.terminal and stdin.source is None and not stdin.piped


def _reader(name: str, shell: bool, inside: Inside) -> None:
    inside.reasons.append(f"`{name}` runs what is typed into its input later (terminal_input)")
    inside.readers.append(InputReader(name, shell))


def _code(what: str, words: tuple[Word, ...], inside: Inside) -> None:
    """Shell text given as words (`eval a b`, `bash -c TEXT`), parsed again; opaque if built from expansions."""
    if any(word.dynamic for word in words):
        inside.reasons.append(f"the text {what} runs is only known at run time")
    inside.inners.append(Inner(script=" ".join(word.text for word in words)))


def _shell(name: str, words: tuple[Word, ...], stdin: Stdin, inside: Inside) -> None:
    scan = _scan(words, _SHELL_OPTIONS)
    operands = words[scan.index :]
    if "c" in scan.short:
        if operands:  # `bash -c` without text fails, running nothing
            _code(f"`{name} -c`", operands[:1], inside)
    elif "s" in scan.short or not operands or operands[0].text in _STDIN_FILES:
        _program_from_stdin(name, stdin, inside, shell=True)
    elif operands[0].substituted:
        inside.reasons.append(f"`{name}` reads its program from a process substitution")


def _interpreter(name: str, words: tuple[Word, ...], stdin: Stdin, inside: Inside) -> None:
    family = _INTERPRETERS[re.sub(r"[0-9.]+$", "", name).removesuffix("js")]
    scan = _scan(words, family.options)
    code = [scan.values[key] for key in family.inline if key in scan.values]
    operands = words[scan.index :]
    if code:
        # An inline program runs what it likes (`python3 -c 'os.system(…)'`): its language is not read here.
        inside.reasons.append(f"the program given inline to `{name}` is not inspected")
    elif not operands and any(key in scan.values for key in family.named):
        pass  # `python3 -m pytest`: a program named, as a script is
    elif not operands or operands[0].text in _STDIN_FILES:
        _program_from_stdin(name, stdin, inside, shell=False)
    elif operands[0].substituted:
        inside.reasons.append(f"`{name}` reads its program from a process substitution")
    if (scan.short | scan.long) & set(family.interactive) and _reads_terminal(stdin):
        _reader(name, False, inside)


def _program_from_stdin(name: str, stdin: Stdin, inside: Inside, shell: bool) -> None:
    """A program read from stdin: seen (and for a shell, parsed) when a here-document or here-string gives it;
    typed later when it is the input the command was started with (terminal_input)."""
    source = stdin.source
    if source is None:
        if stdin.piped:
            inside.reasons.append(f"`{name}` reads its program from a pipe")
        elif stdin.terminal:
            _reader(name, shell, inside)
        return
    if source.body is None:
        inside.reasons.append(f"`{name}` reads its program from {source.target!r}, which is not inspected")
        return
    if not shell:
        inside.reasons.append(f"the program `{name}` reads from a here-document is not inspected")
    elif not source.literal:
        inside.reasons.append(f"the program `{name}` reads from a here-document is built at run time")
    if shell:
        inside.inners.append(Inner(script=source.body, script_from_stdin=True))


def _wrapper(name: str, words: tuple[Word, ...], stdin: Stdin, inside: Inside) -> None:
    spec = _WRAPPERS[name]
    scan = _scan(words, spec)
    if scan.short & set(spec.no_command) or scan.long & spec.long_no_command:
        return
    if name == "env" and ("S" in scan.short or "split-string" in scan.long):
        inside.reasons.append("`env -S` splits its own command line, which is not inspected")
        return
    index = scan.index
    assignments: list[str] = []
    while spec.assignments and index < len(words) and ASSIGNMENT.match(words[index].text):
        assignments.append(words[index].text)
        index += 1
    index += spec.operands
    if index >= len(words):
        if scan.short & set(spec.shell):
            _program_from_stdin(f"{name} -{''.join(sorted(scan.short & set(spec.shell)))}", stdin, inside, True)
        elif name == "chroot" and index == len(words):  # `chroot DIR` runs an interactive shell
            _program_from_stdin("chroot", stdin, inside, True)
        return
    chdir = next((scan.values[key] for key in spec.chdir if key in scan.values), None)
    inner = Inner(words=words[index:], assignments=tuple(assignments), more_args_unknown=name == "xargs")
    if chdir is not None:
        inner = replace(inner, chdir=(None if chdir.dynamic else chdir.text,))
    inside.inners.append(inner)


def _su(words: tuple[Word, ...], stdin: Stdin, inside: Inside) -> None:
    scan = _scan(words, _SU_OPTIONS)
    code = next((scan.values[key] for key in ("c", "command", "session-command") if key in scan.values), None)
    if code is None:
        _program_from_stdin("su", stdin, inside, shell=True)
    else:
        _code("`su -c`", (code,), inside)


def _trap(words: tuple[Word, ...], inside: Inside) -> None:
    operands = words[2:] if len(words) > 1 and words[1].text == "--" else words[1:]
    if len(operands) >= 2 and operands[0].text not in ("-", "-p", "-l", "-P"):  # else it lists or resets traps
        _code("`trap`", operands[:1], inside)


_FIND_PRIMARY = re.compile(r"[-(!),]")
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(words: tuple[Word, ...], inside: Inside) -> None:
    index = 1
    while index < len(words):
        text = words[index].text
        if text in ("-H", "-L", "-P") or text.startswith("-O"):
            index += 1
        elif text == "-D":
            index += 2
        else:
            break
    starts: list[str] = []
    while index < len(words) and not _FIND_PRIMARY.match(words[index].text):
        starts.append(words[index].text)
        index += 1
    while index < len(words):
        if words[index].text in _FIND_EXEC:
            end = index + 1
            while end < len(words) and words[end].text not in (";", "+"):
                end += 1
            if end > index + 1:
                inside.inners.append(Inner(words=words[index + 1 : end], placeholder_under=tuple(starts) or (".",)))
            index = end
        index += 1


def cd_target(words: tuple[Word, ...]) -> str | None:
    """Where `cd`/`pushd` go: a literal directory, `~` for a bare `cd`; None when unknown (`cd -`, `cd $X`,
    `popd`)."""
    name = posixpath.basename(words[0].text)
    operands = [word for word in words[1:] if not (word.text.startswith("-") and len(word.text) > 1)]
    if name == "popd" or (not operands and name != "cd"):
        return None
    if not operands:
        return "~"
    return None if operands[0].dynamic or operands[0].text == "-" else operands[0].text
