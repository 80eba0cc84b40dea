"""The policy's shell parse (mcpserver/policy/shell.py): the simple commands a command string would run, what
wrappers run inside, and when what runs cannot be seen (opaque)."""

from __future__ import annotations

import random
import shlex
import time

import pytest

from mcpserver.policy.commands import ParsedCommand, Redirect, SimpleCommand
from mcpserver.policy.plain import plain_commands
from mcpserver.policy.shell import MAX_COMMAND_CHARS, MAX_DEPTH, MAX_SIMPLE_COMMANDS, parse_command, read


def argvs(text: str) -> list[tuple[str, ...]]:
    return [command.argv for command in parse_command(text).commands]


def only(text: str, name: str) -> SimpleCommand:
    found = [command for command in parse_command(text).commands if command.name == name]
    assert len(found) == 1, parse_command(text)
    return found[0]


def visible(text: str) -> ParsedCommand:
    parsed = parse_command(text)
    assert not parsed.opaque, parsed.opaque_reasons
    return parsed


def opaque_reason(text: str) -> str:
    parsed = parse_command(text)
    assert parsed.opaque, parsed
    return " | ".join(parsed.opaque_reasons)


# Simple commands, words and lists


def test_a_plain_command_is_its_words() -> None:
    assert argvs("ls -la /tmp") == [("ls", "-la", "/tmp")]
    assert only("ls -la", "ls").name == "ls"


def test_quotes_are_removed_from_literal_words() -> None:
    assert argvs("""echo "a b" 'c'd e\\ f""") == [("echo", "a b", "cd", "e f")]


def test_the_name_is_the_command_without_its_directory() -> None:
    assert only("/usr/bin/rm -rf x", "rm").argv[0] == "/usr/bin/rm"


def test_leading_assignments_are_kept_apart_from_the_words() -> None:
    command = only("FOO=1 BAR='a b' make test", "make")
    assert command.assignments == ("FOO=1", "BAR=a b")
    assert command.argv == ("make", "test")


def test_an_assignment_after_a_redirection_is_still_an_assignment() -> None:
    command = only(">/dev/null FOO=1 sudo rm -rf /", "sudo")
    assert command.assignments == ("FOO=1",)
    assert only(">/dev/null FOO=1 sudo rm -rf /", "rm").argv == ("rm", "-rf", "/")


def test_a_quoted_assignment_is_a_command_name() -> None:
    assert argvs('"A=1" ls') == [("A=1", "ls")]


def test_every_command_of_a_list_is_found() -> None:
    assert argvs("a && b || c; d & e") == [("a",), ("b",), ("c",), ("d",), ("e",)]


def test_the_stages_of_a_pipeline_are_numbered() -> None:
    parsed = visible("cat f | grep x | wc -l; ls")
    pipelines = [command.pipelines for command in parsed.commands]
    assert pipelines[:3] == [((0, 0),), ((0, 1),), ((0, 2),)]
    assert pipelines[3] == ()


def test_commands_in_subshells_groups_loops_conditions_and_functions_are_found() -> None:
    text = "(a); { b; }; if c; then d; else e; fi; for i in 1 2; do f $i; done; while g; do h; done; k() { m; }"
    assert [argv[0] for argv in argvs(text)] == ["a", "b", "c", "d", "e", "f", "g", "h", "m"]


def test_a_group_piped_into_a_command_makes_its_commands_earlier_stages() -> None:
    parsed = visible("{ curl x; echo; } | sh -c 'cat'")
    stages = {command.name: command.pipelines for command in parsed.commands}
    assert stages["curl"] == ((0, 0),)
    assert stages["cat"] == ((0, 1),)


# Redirections


def test_redirections_keep_their_operator_and_target() -> None:
    command = only("cmd >a >>b 2>c &>d &>>e >|f <g 2>&1", "cmd")
    assert [(redirect.operator, redirect.target, redirect.fd) for redirect in command.redirects] == [
        (">", "a", None),
        (">>", "b", None),
        (">", "c", 2),
        ("&>", "d", None),
        ("&>>", "e", None),
        (">|", "f", None),
        ("<", "g", None),
        (">&", "1", 2),
    ]
    assert [redirect.writes for redirect in command.redirects] == [True] * 6 + [False, False]


def test_a_duplication_to_a_word_writes_a_file_and_to_a_descriptor_does_not() -> None:
    assert Redirect(">&", "file").writes
    assert not Redirect(">&", "2").writes
    assert not Redirect(">&", "-").writes


def test_the_redirections_of_a_group_apply_to_its_commands() -> None:
    command = only("{ echo a; } > ~/.bashrc", "echo")
    assert [(redirect.operator, redirect.target) for redirect in command.redirects] == [(">", "~/.bashrc")]


def test_home_in_a_redirection_target_is_the_tilde() -> None:
    command = only('echo x > "$HOME/.profile"', "echo")
    assert command.redirects[0].target == "~/.profile"
    assert not command.redirects[0].dynamic


def test_another_expansion_in_a_target_is_marked_dynamic() -> None:
    assert only("echo x > $OUT/f", "echo").redirects[0].dynamic


# Substitutions


@pytest.mark.parametrize(
    "text",
    [
        "echo $(sudo id)",
        "echo `sudo id`",
        'echo "$(sudo id)"',
        "X=$(sudo id) true",
        "cat < <(sudo id)",
        "echo x > >(sudo id)",
        "echo x > $(sudo id)",
        "for i in $(sudo id); do echo $i; done",
        'echo "$(echo "$(sudo id)")"',
    ],
)
def test_commands_in_substitutions_of_any_word_are_found(text: str) -> None:
    assert only(text, "sudo").argv == ("sudo", "id")


def test_a_word_with_a_substitution_is_marked_dynamic() -> None:
    command = only("rm -rf $(pwd)/x", "rm")
    assert command.dynamic == frozenset({2})


def test_the_command_in_an_output_process_substitution_reads_a_pipe() -> None:
    assert "pipe" in opaque_reason("curl x | tee >(sh)")


# Wrappers


def test_env_gives_its_assignments_to_the_command_it_runs() -> None:
    parsed = visible("env -i -u HOME --unset=PATH FOO=1 BAR=2 make -j4")
    assert [command.name for command in parsed.commands] == ["env", "make"]
    make = parsed.commands[1]
    assert make.assignments == ("FOO=1", "BAR=2")
    assert make.argv == ("make", "-j4")
    assert parsed.commands[0].wrapper and not make.wrapper


@pytest.mark.parametrize(
    "text",
    [
        "sudo rm -rf x",
        "sudo -u root rm -rf x",
        "sudo -uroot -g wheel rm -rf x",
        "sudo -C 5 -D /tmp -h host -p 'pw:' -r role -t type -U bob -E rm -rf x",
        "sudo --user=root --preserve-env rm -rf x",
        "sudo -u root -- rm -rf x",
        "sudo VAR=1 rm -rf x",
        "doas -u root rm -rf x",
        "pkexec --user root rm -rf x",
        "nohup rm -rf x",
        "setsid -f rm -rf x",
        "nice -n 10 rm -rf x",
        "nice -10 rm -rf x",
        "ionice -c 3 rm -rf x",
        "stdbuf -oL -e 0 rm -rf x",
        "timeout 5 rm -rf x",
        "timeout -s KILL -k 10 5m rm -rf x",
        "timeout --signal=TERM 5 rm -rf x",
        "chroot /srv/root rm -rf x",
        "command rm -rf x",
        "builtin rm -rf x",
        "exec -a name rm -rf x",
        "time rm -rf x",
        "time -p rm -rf x",
        "/usr/bin/time -f %e -o log rm -rf x",
        "xargs rm -rf x",
        "xargs -0 -I {} -n 1 -P 4 -L 2 -s 100 -d , -E end -a list rm -rf x",
        "xargs -i{} rm -rf x",
        "env FOO=1 sudo -u root nice -n 5 timeout 5 rm -rf x",
    ],
)
def test_wrappers_are_seen_through_with_their_options_and_values(text: str) -> None:
    assert only(text, "rm").argv == ("rm", "-rf", "x")


def test_every_layer_of_wrappers_is_listed() -> None:
    assert argvs("env A=1 sudo rm x") == [("env", "A=1", "sudo", "rm", "x"), ("sudo", "rm", "x"), ("rm", "x")]


def test_a_wrapper_with_options_meaning_nothing_runs_runs_nothing() -> None:
    assert argvs("sudo -l rm x") == [("sudo", "-l", "rm", "x")]
    assert argvs("command -v rm") == [("command", "-v", "rm")]
    assert not only("sudo -l rm x", "sudo").wrapper


def test_xargs_gives_its_command_arguments_only_known_at_run_time() -> None:
    assert only("find . | xargs rm -r", "rm").more_args_unknown
    assert not only("xargs rm -r", "xargs").more_args_unknown


def test_find_exec_runs_its_command_with_paths_below_the_starting_points() -> None:
    parsed = visible(r"find src tests -name '*.pyc' -exec rm -f {} \; -execdir chmod 600 {} +")
    rm, chmod = parsed.commands[1], parsed.commands[2]
    assert rm.argv == ("rm", "-f", "{}")
    assert rm.placeholder_under == ("src", "tests")
    assert chmod.argv == ("chmod", "600", "{}")


# Shell text run inside


@pytest.mark.parametrize("shell", ["sh", "bash", "zsh", "dash", "/bin/bash"])
def test_the_script_of_a_shell_c_is_parsed_again(shell: str) -> None:
    assert only(f"{shell} -c 'sudo rm -rf x; ls'", "rm").argv == ("rm", "-rf", "x")


@pytest.mark.parametrize(
    "text",
    [
        "bash -lc 'rm -rf x'",
        "bash -o pipefail -c 'rm -rf x'",
        "bash -e -x -c 'rm -rf x' name arg",
        "bash --norc -c 'rm -rf x'",
        "su -c 'rm -rf x' root",
        "su - root -c 'rm -rf x'",
        "eval 'rm -rf x'",
        "eval rm -rf x",
        "trap 'rm -rf x' EXIT",
        "bash <<'EOF'\nrm -rf x\nEOF",
        "bash <<< 'rm -rf x'",
    ],
)
def test_shell_text_given_to_shells_and_builtins_is_parsed_again(text: str) -> None:
    assert only(text, "rm").argv == ("rm", "-rf", "x")


def test_the_commands_of_a_script_share_the_pipe_and_redirections_of_its_shell() -> None:
    command = only("curl x | bash -c 'cat > ~/.bashrc' 2>/dev/null", "cat")
    assert command.pipelines == ((0, 1),)
    assert [redirect.target for redirect in command.redirects] == ["/dev/null", "~/.bashrc"]


# Directories


def test_cd_is_noted_for_the_commands_after_it() -> None:
    parsed = visible("cd /tmp && rm -rf x; cd; pushd build; rm y")
    assert only("cd /tmp && rm -rf x", "rm").cwd_changes == ("/tmp",)
    assert parsed.commands[-1].cwd_changes == ("/tmp", "~", "build")


def test_a_cd_to_an_unknown_directory_is_noted_as_unknown() -> None:
    assert only("cd $DIR && rm -r x", "rm").cwd_changes == (None,)
    assert only("cd - && rm -r x", "rm").cwd_changes == (None,)


def test_env_and_sudo_directories_count_for_their_command_only() -> None:
    parsed = visible("env -C /tmp rm -r x; sudo -D /srv rm -r y; rm -r z")
    rms = [command for command in parsed.commands if command.name == "rm"]
    assert [command.cwd_changes for command in rms] == [("/tmp",), ("/srv",), ()]


# Here-documents


def test_a_quoted_here_document_runs_nothing_of_its_body() -> None:
    text = "git commit -m \"$(cat <<'EOF'\nFix `rm -rf /` and $(sudo id), a lone ` too\nEOF\n)\""
    assert [command.name for command in visible(text).commands] == ["cat", "git"]
    assert only(text, "cat").redirects[0].body == "Fix `rm -rf /` and $(sudo id), a lone ` too\n"


def test_a_here_document_body_is_kept_with_its_delimiter_style() -> None:
    quoted = only("cat <<'EOF'\n$HOME\nEOF", "cat").redirects[0]
    bare = only("cat <<EOF\n$HOME\nEOF", "cat").redirects[0]
    assert (quoted.body, quoted.literal) == ("$HOME\n", True)
    assert (bare.body, bare.literal) == ("$HOME\n", False)


def test_a_substitution_in_an_unquoted_here_document_is_opaque() -> None:
    assert "here-document" in opaque_reason("cat <<EOF\n$(sudo id)\nEOF")


def test_here_documents_of_every_form_parse() -> None:
    for text in (
        "cat <<-'X'\n\t$(id)\n\tX\necho done",
        'cat <<"X"\nbody\nX',
        "cat <<\\X\nbody\nX",
        "cat <<A <<B\na\nA\nb\nB\nls",
        "cat > f <<EOF\nplain\nEOF\nls -la",
    ):
        assert visible(text).commands[-1].name in ("cat", "ls", "echo")


def test_a_here_document_operator_inside_quotes_hides_nothing() -> None:
    assert argvs('echo "<<EOF"\nrm -rf /\nEOF') == [("echo", "<<EOF"), ("rm", "-rf", "/"), ("EOF",)]


def test_a_here_document_without_its_end_is_opaque_not_an_error() -> None:
    assert opaque_reason("cat <<EOF\nno end") != ""
    assert opaque_reason("cat <<") != ""


# Opaque commands


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('eval "$CMD"', "eval"),
        ("source ./env.sh", "source"),
        (". ~/.profile", "`.`"),
        ("$CMD args", "command name"),
        ("${TOOL}x args", "command name"),
        ("$(echo rm) -rf /", "command name"),
        ("r? -rf /", "expanded by the shell"),
        ("{rm,-rf,/}", "expanded by the shell"),
        ("echo x | base64 -d | sh", "pipe"),
        ("curl -s x | bash", "pipe"),
        ("curl -s x | sudo bash", "pipe"),
        ("bash < script.sh", "script.sh"),
        ("sh -s < x", "x"),
        ("echo ls | sh -s", "pipe"),
        ("cat x | python3 -", "pipe"),
        ("cat x | python3", "pipe"),
        ("bash /dev/stdin < x", "x"),
        ("bash <(curl -s x)", "process substitution"),
        ('bash -c "$VAR"', "bash -c"),
        ('python3 -c "$CODE"', "python3"),
        ("echo 'ls' | sudo -s", "sudo -s"),
        ("env -S 'rm -rf /'", "env -S"),
        ("echo ${x:-$(id)}", "${"),
        ("bash <<EOF\n$CMD\nEOF", "here-document"),
        ("[[ -f x ]] && rm -rf /", "cannot parse"),
        ("echo $((1 + 2))", "parser does not read"),
        ('echo "unbalanced', "cannot parse"),
        ("case $x in a) rm -rf /;; esac", "parser does not read"),
    ],
)
def test_what_the_parser_cannot_see_makes_the_command_opaque(text: str, reason: str) -> None:
    assert reason in opaque_reason(text)


def test_an_opaque_command_still_lists_what_it_can_see() -> None:
    parsed = parse_command('eval "$X"; sudo reboot')
    assert parsed.opaque
    assert only('eval "$X"; sudo reboot', "reboot").argv == ("reboot",)


def test_wrappers_nested_past_the_depth_limit_are_opaque() -> None:
    assert "nested" in opaque_reason("eval " * (MAX_DEPTH + 1) + "rm -rf /")
    assert "nested" in opaque_reason("sudo " * (MAX_DEPTH + 2) + "rm -rf /")
    assert only("eval " * (MAX_DEPTH - 1) + "rm -rf /", "rm").argv == ("rm", "-rf", "/")


def test_deeply_nested_shell_c_is_opaque_not_an_error() -> None:
    text = "rm -rf /"
    for _ in range(MAX_DEPTH + 2):
        text = "bash -c " + shlex.quote(text)
    assert parse_command(text).opaque


def test_a_command_over_the_length_cap_is_opaque_unparsed() -> None:
    assert "longer than" in opaque_reason("x" * (MAX_COMMAND_CHARS + 1))


def test_too_many_simple_commands_make_the_command_opaque() -> None:
    parsed = parse_command("true; " * (MAX_SIMPLE_COMMANDS + 5))
    assert parsed.opaque
    assert len(parsed.commands) <= MAX_SIMPLE_COMMANDS


def test_blank_text_runs_nothing() -> None:
    assert parse_command("") == ParsedCommand(())
    assert parse_command("  \t ") == ParsedCommand(())


# Hostile input


@pytest.mark.parametrize(
    "text",
    [
        "x" * 100_000,
        "a|" * 50_000,
        "$(" * 50_000,
        "(" * 50_000 + "ls" + ")" * 50_000,
        "'" * 100_001,
        '"$(x)" ' * 14_000,
        "cat <<EOF\n" + "x\n" * 50_000,
        "{ " * 3_000 + "ls" + "; }" * 3_000,
        "(" * 600 + "ls" + ")" * 600,
        "$a|" * 4_000,
    ],
)
def test_hostile_text_is_read_quickly_or_refused_without_an_error(text: str) -> None:
    # Not a timing assertion: each reads in milliseconds, and only a runaway (a quadratic walk, a hang) takes this long.
    started = time.monotonic()
    parsed = read(text)
    assert time.monotonic() - started < 30
    assert len(parsed.commands) <= MAX_SIMPLE_COMMANDS


def test_random_shell_like_text_never_raises() -> None:
    pieces = ["ls", "'", '"', "$(", ")", "`", "<<EOF\n", "EOF\n", "|", "&&", ";", "{", "}", "(", ")", "\\", "$x", "\n"]
    pieces += ["bash -c ", "sudo ", "<(", ">(", "${", "}", "#", "2>&1", "> f", "eval ", "time ", "[[", "case "]
    chooser = random.Random(7)
    for _ in range(1500):
        text = "".join(chooser.choice(pieces) for _ in range(chooser.randint(1, 12)))
        parsed = read(text)
        assert isinstance(parsed, ParsedCommand)


# The reading without bashlex


_PLAIN_CORPUS = [
    "ls",
    "git status",
    "a=1 b=2 cmd x",
    "a=1",
    "a+=1 ls",
    "a.b=1 ls",
    "echo a=b",
    "ls; ls",
    "ls &",
    "a && b || c; d & e",
    "a | b | c",
    "cmd 2>&1 | tail -20",
    "cmd > out 2>&1",
    "cmd 2>/dev/null",
    "cmd &>log",
    "cmd &>>log",
    "cmd <in",
    ">out",
    "a>b",
    "a2>x",
    "12>x cmd",
    "cmd >&-",
    ">f A=1 cmd",
    "[ -f x ] && ls",
    "rm -rf /tmp/*",
    "echo ~/x ~ a~b",
    "x|y",
    "x&&y",
    "find . -name *.py",
    "cp a,b c",
    "echo ^x %y @z +w :v",
    "a[1]=x ls",
    "ls -- -x",
    "FOO=~/x cmd",
]


def _generated(count: int) -> list[str]:
    alphabet = ["ls", "a=1", ">f", "2>&1", "|", "&&", ";", "&", "x", "-r", "<i", "&>o", ">>p", "2>e", "sudo", "cd"]
    chooser = random.Random(3)
    return [" ".join(chooser.choice(alphabet) for _ in range(chooser.randint(1, 7))) for _ in range(count)]


def test_plain_commands_are_read_as_bashlex_reads_them() -> None:
    compared = 0
    for text in _PLAIN_CORPUS + _generated(1500):
        if plain_commands(text, 10_000) is None:
            continue
        compared += 1
        assert read(text) == read(text, plain=False), text
    assert compared > 500


def test_text_with_quotes_or_expansions_is_not_read_as_plain() -> None:
    for text in ("echo 'a'", "echo $x", "a\nb", "cat <<EOF", "ls | & x", "ls >| f", "if true; then ls; fi", "ls # x"):
        assert plain_commands(text, 10_000) is None, text
