"""apply_patch's pure part (mcpserver/executor/patch.py): reading the Codex patch format, the paths the policy sees,
and a file's hunks found and applied as Codex finds them, with the diagnostic of a hunk that does not apply."""

from __future__ import annotations

import pytest

from mcpserver.executor.patch import (
    AddFile,
    DeleteFile,
    Hunk,
    PatchError,
    UpdateFile,
    apply_hunks,
    parse_patch,
    patch_paths,
)

SOURCE = "import os\n\n\nclass Greeter:\n    def greet(self):\n        print('Hi')\n        return 1\n\n    def wave(self):\n        return 2\n"


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


def refusal(text: str) -> str:
    with pytest.raises(PatchError) as caught:
        parse_patch(text)
    return str(caught.value)


def applied(text: str, *lines: str) -> str:
    (update,) = parse_patch(patch("*** Update File: f.py", *lines))
    assert isinstance(update, UpdateFile)
    return apply_hunks(text, update.hunks, "/ws/f.py").text


def not_applied(text: str, *lines: str) -> str:
    with pytest.raises(PatchError) as caught:
        applied(text, *lines)
    return str(caught.value)


# --- reading a patch ---------------------------------------------------------------------------------------------


def test_every_operation_of_several_files_is_read_in_order() -> None:
    ops = parse_patch(
        patch(
            "*** Add File: docs/hello.txt",
            "+Hello",
            "+",
            "+world",
            "*** Delete File: old.txt",
            "*** Update File: src/app.py",
            "*** Move to: src/main.py",
            "@@ def greet():",
            "-    print('Hi')",
            "+    print('Hello')",
            "*** Update File: README.md",
            " intro",
            "+more",
        )
    )
    assert ops == (
        AddFile("docs/hello.txt", "Hello\n\nworld\n", 2),
        DeleteFile("old.txt", 6),
        UpdateFile(
            "src/app.py",
            "src/main.py",
            (Hunk(("def greet():",), (("-", "    print('Hi')"), ("+", "    print('Hello')")), False, 9),),
            7,
        ),
        UpdateFile("README.md", None, (Hunk((), ((" ", "intro"), ("+", "more")), False, 13),), 12),
    )


def test_the_policy_sees_every_path_a_patch_names_move_destinations_included() -> None:
    text = patch(
        "*** Add File: a.txt",
        "+a",
        "*** Delete File: b.txt",
        "*** Update File: c.py",
        "*** Move to: d/c.py",
        "@@",
        "+x",
    )
    assert patch_paths(text) == ["a.txt", "b.txt", "c.py", "d/c.py"]


def test_hunks_with_several_anchors_an_end_of_file_marker_and_blank_lines_between_them() -> None:
    (update,) = parse_patch(
        patch(
            "*** Update File: f.py",
            "@@ class Greeter:",
            "@@     def wave(self):",
            "-        return 2",
            "+        return 3",
            "*** End of File",
            "",
            "@@",
            " a",
            "",
            "-b",
        )
    )
    assert isinstance(update, UpdateFile)
    first, second = update.hunks
    assert first.anchors == ("class Greeter:", "    def wave(self):") and first.end_of_file
    assert second.anchors == () and second.lines == ((" ", "a"), (" ", ""), ("-", "b"))


def test_a_unified_diff_hunk_header_counts_as_its_anchor_and_a_bare_one_as_none() -> None:
    (update,) = parse_patch(patch("*** Update File: f.py", "@@ -4,7 +4,7 @@ class Greeter:", "-x", "+y"))
    assert isinstance(update, UpdateFile) and update.hunks[0].anchors == ("class Greeter:",)
    (update,) = parse_patch(patch("*** Update File: f.py", "@@ -4,7 +4,7 @@", "-x", "+y"))
    assert isinstance(update, UpdateFile) and update.hunks[0].anchors == ()


def test_padding_around_markers_crlf_line_ends_and_a_heredoc_wrapper_are_forgiven() -> None:
    padded = "  *** Begin Patch  \r\n*** Add File:  a.txt \r\n+one\r\n *** End Patch \r\n"
    assert parse_patch(padded) == (AddFile("a.txt", "one\n", 2),)
    wrapped = "<<'EOF'\n" + patch("*** Delete File: a.txt") + "\nEOF\n"
    assert parse_patch(wrapped) == (DeleteFile("a.txt", 3),)


def test_a_rename_without_hunks_is_a_move() -> None:
    assert parse_patch(patch("*** Update File: a.txt", "*** Move to: b.txt")) == (UpdateFile("a.txt", "b.txt", (), 2),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("*** Add File: a\n+x\n*** End Patch", "its first line must be '*** Begin Patch'"),
        ("*** Begin Patch\n*** Add File: a\n+x", "its last line must be '*** End Patch'"),
        ("", "its first line must be '*** Begin Patch'"),
        (patch(), "it changes no file"),
        (patch("*** Frobnicate File: a"), "line 2: '*** Frobnicate File: a' is not a file header"),
        (patch("*** Add File: a", "+x", "y"), "every line of an added file starts with '+'"),
        (patch("*** Add File:"), "line 2: '*** Add File:' names no path"),
        (patch("*** Update File: a"), "line 2: '*** Update File: a' has no hunk"),
        (patch("*** Update File: a", "@@ f", "x = 1"), "line 4: 'x = 1': every line of a hunk starts with ' '"),
        (patch("*** Update File: a", "@@", "-x", "+y", "@@ g"), "line 6: the hunk has no lines"),
        (patch("*** Update File: a", "-x", "*** End of File", "+y"), "line 5: a hunk after '*** End of File' starts"),
        (patch("*** Update File: a", "@@", "*** End of File"), "'*** End of File' must follow a hunk's lines"),
        (patch("*** Update File: a", "-x", "oops", "+y"), "line 4: 'oops': every line of a hunk starts with"),
        (patch("*** End of File"), "'*** End of File' ends a hunk, after its lines"),
        ("diff --git a/x b/x\n--- a/x\n+++ b/x", "this looks like a unified diff"),
    ],
)
def test_a_malformed_patch_is_refused_naming_the_line_and_what_was_expected(text: str, expected: str) -> None:
    message = refusal(text)
    assert message.startswith("Error: invalid patch: ") and expected in message, message


# --- applying a file's hunks ---------------------------------------------------------------------------------------


def test_a_hunk_replaces_its_lines_and_keeps_the_rest() -> None:
    out = applied(SOURCE, "@@ def greet(self):", "-        print('Hi')", "+        print('Hello')", "         return 1")
    assert out == SOURCE.replace("'Hi'", "'Hello'")


def test_anchors_are_sought_in_turn_so_a_repeated_block_is_told_apart() -> None:
    text = "def a():\n    return 0\n\ndef b():\n    return 0\n"
    assert applied(text, "@@ def b():", "-    return 0", "+    return 1") == text.replace(
        "b():\n    return 0", "b():\n    return 1"
    )
    assert applied(text, "-    return 0", "+    return 1") == text.replace("0", "1", 1)


def test_hunks_apply_one_after_the_other_and_must_come_in_file_order() -> None:
    lines = ["@@ def wave(self):", "-        return 2", "+        return 3", "@@ def greet(self):", "-        return 1"]
    message = not_applied(SOURCE, *lines, "+        return 0")
    assert "hunk 2 of 2 (patch line 6) did not apply, so no file was changed" in message
    assert "matches no line of the file after line 10; it matches line 5, before that" in message


def test_context_is_matched_ignoring_whitespace_at_line_ends_and_keeps_the_files_own_text() -> None:
    text = "a = 1   \n\tb = 2\nc = 3\n"
    assert applied(text, " a = 1", "   b = 2", "-c = 3", "+c = 4") == "a = 1   \n\tb = 2\nc = 4\n"


def test_typographic_quotes_and_dashes_in_the_file_match_their_ascii_forms() -> None:
    text = "msg = \u201chello \u2014 world\u201d\nx = 1\n"
    assert applied(text, ' msg = "hello - world"', "-x = 1", "+x = 2") == text.replace("x = 1", "x = 2")


def test_end_of_file_ties_a_hunk_to_the_end_and_a_hunk_only_adding_goes_after_its_anchor_or_at_the_end() -> None:
    text = "x\ny\nx\n"
    assert applied(text, "@@", "-x", "+z", "*** End of File") == "x\ny\nz\n"
    message = not_applied(text, "@@", "-y", "+z", "*** End of File")
    assert "are not the end of the file, as '*** End of File' says; they occur at line 2" in message
    assert applied(text, "@@ y", "+after y") == "x\ny\nafter y\nx\n"
    assert applied(text, "+appended") == "x\ny\nx\nappended\n"


def test_a_trailing_empty_context_line_may_stand_for_the_final_newline() -> None:
    assert applied("a\nb\n", "-b", "+c", "") == "a\nc\n"


def test_a_crlf_file_keeps_its_endings_and_the_result_ends_with_a_newline() -> None:
    assert applied("one\r\ntwo\r\n", " one", "-two", "+2") == "one\r\n2\r\n"
    assert applied("one\ntwo", " one", "-two", "+2") == "one\n2\n"


def test_a_hunk_that_does_not_apply_shows_the_closest_region_and_what_differs() -> None:
    message = not_applied(SOURCE, "@@ class Greeter:", "     def greet(self):", "-\tprint('hi')", "+\tprint('yo')")
    first, *rest = message.split("\n")
    assert first.startswith("Error: /ws/f.py: hunk 1 of 1 (patch line 3) did not apply, so no file was changed")
    assert "its 2 lines of context and '-' were not found after line 4. The closest region is lines 5-6" in first
    assert "indentation: tabs vs spaces" in first and "letter case" in first
    assert rest[0].startswith("(- the file, + the hunk;")
    assert "-         print('Hi')" in rest and "+ \\tprint('hi')" in rest


def test_an_anchor_that_is_nowhere_is_shown_beside_the_line_most_like_it() -> None:
    message = not_applied(SOURCE, "@@ def greeet(self):", "-        return 1", "+        return 0")
    assert "its @@ line 'def greeet(self):' matches no line of the file. The closest region is line 5" in message
    assert "(- the file, + the @@ line;" in message


def test_a_hunk_with_nothing_alike_says_so() -> None:
    message = not_applied(SOURCE, "-completely different", "+x")
    assert message.endswith("were not found; no similar region either (read the file again)")
