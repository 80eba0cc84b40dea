"""What a timed grant covers (mcpserver/policy_gate.py `command_shape`): a command's names and options, except a
command run as another user, which must match word for word (issue 31), and an opaque one, exactly; never two
commands alike only in the first characters a shape can hold."""

from __future__ import annotations

import pytest

from mcpserver.policy_gate import SHAPE_CHARS, command_shape


def shape(command: str, rule_id: str = "privilege", tool: str = "terminal_exec") -> str:
    key = "text" if tool == "terminal_input" else "command"
    return command_shape(tool, {key: command}, rule_id)


def test_operands_of_an_ordinary_command_are_not_part_of_its_shape() -> None:
    assert shape("git push --force origin main") == shape("git push --force origin fix")


@pytest.mark.parametrize(
    ("granted", "other"),
    [
        ("sudo -n true", "sudo -n true; id"),
        ("sudo -n true", "sudo -n true x"),
        ("sudo -n tee /tmp/notes", "sudo -n tee /etc/shadow"),
        ("sudo -n -u root true", "sudo -n -u alice true"),
        ("doas rm -rf /tmp/x", "doas rm -rf /"),
        ("su -c 'ls /root'", "su -c 'rm -rf /root'"),
        ("env X=1 sudo -n ls", "env X=1 sudo -n rm -rf /"),
    ],
)
def test_a_grant_for_a_command_run_as_another_user_is_for_those_words(granted: str, other: str) -> None:
    assert shape(granted) != shape(other)
    assert shape(granted) == shape(granted)


def test_a_call_the_opaque_part_decided_is_granted_exactly() -> None:
    assert shape("r", "opaque", "terminal_input") != shape("r x", "opaque", "terminal_input")
    assert shape('eval "$X"', "opaque") != shape('eval "$Y"', "opaque")


def test_text_typed_into_a_job_has_the_shape_of_a_command() -> None:
    typed = shape("git push -f origin a\n", "force-push", "terminal_input")
    assert typed == shape("git push -f origin b", "force-push") != shape("git push origin a", "force-push")


def test_long_shapes_alike_in_their_first_characters_differ() -> None:
    head = "echo a; " * 60
    first, second = shape(head + "echo b", "x"), shape(head + "rm -r /tmp/x", "x")
    assert first != second and len(first) == len(second) == SHAPE_CHARS
    exact = shape("eval " + "x" * 400 + " a", "opaque"), shape("eval " + "x" * 400 + " b", "opaque")
    assert exact[0] != exact[1] and max(map(len, exact)) <= SHAPE_CHARS
