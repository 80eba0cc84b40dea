"""file_edit's pure part (mcpserver/executor/edits.py): matching, the no-match diagnostic and the diff."""

from __future__ import annotations

import difflib

import pytest

from mcpserver.executor import edits
from mcpserver.executor.edits import Edit
from mcpserver.executor.interface import ToolFailure

PYTHON = "def f():\n\tif x:  \n\t\treturn 1\n\ndef g():\n    pass\n"


def apply_edits(text: str, steps: list[Edit], path: str) -> tuple[str, int]:
    """edits.apply_edits on the text's UTF-8, as editing.py calls it: the edited text and the replacements."""
    applied = edits.apply_edits(text.encode(), steps, path)
    return applied.data.decode(), applied.replacements


def unified_diff(before: str, after: str, path: str) -> str:
    old, new = before.encode(), after.encode()
    return edits.unified_diff(old, edits.Applied.of(old, new, 1), path)


def refusal(text: str, *steps: Edit) -> str:
    with pytest.raises(ToolFailure) as caught:
        apply_edits(text, list(steps), "/ws/a.py")
    message = str(caught.value)
    assert message.startswith("Error: ")
    return message


def test_a_unique_old_string_is_replaced_once() -> None:
    assert apply_edits(PYTHON, [Edit("    pass", "    return 2")], "p") == (
        PYTHON.replace("    pass", "    return 2"),
        1,
    )


def test_replace_all_replaces_every_occurrence_and_counts_them() -> None:
    assert apply_edits("a b a b a", [Edit("a", "c", replace_all=True)], "p") == ("c b c b c", 3)


def test_several_matches_without_replace_all_are_refused_with_their_line_numbers() -> None:
    message = refusal("x = 1\ny = 2\nx = 1\n\nx = 1\n", Edit("x = 1", "x = 3"))
    assert "occurs 3 times (at lines 1, 3, 5)" in message and "replace_all" in message


def test_an_empty_old_string_or_one_equal_to_new_string_is_refused() -> None:
    assert "old_string is empty" in refusal(PYTHON, Edit("", "x"))
    assert "are the same" in refusal(PYTHON, Edit("pass", "pass"))


def test_no_match_names_trailing_whitespace_and_shows_the_region() -> None:
    message = refusal(PYTHON, Edit("\tif x:\n\t\treturn 1", "y"))
    assert "old_string not found" in message and "lines 2-3" in message
    assert "trailing whitespace" in message
    assert "- \\tif x:\u00b7\u00b7" in message and "+ \\tif x:\n" in message


def test_no_match_names_tabs_against_spaces() -> None:
    message = refusal(PYTHON, Edit("    if x:  \n        return 1", "y"))
    assert "lines 2-3" in message and "indentation: tabs vs spaces" in message


def test_no_match_names_a_difference_of_case_with_character_markers() -> None:
    message = refusal(PYTHON, Edit("def G():", "y"))
    assert "line 5" in message and "letter case" in message
    assert "?     ^" in message


def test_no_match_names_crlf_line_endings() -> None:
    message = refusal("a\r\nb\nc\n", Edit("a\r\nb\r\n", "y"))
    assert "line endings: the file has LF" in message
    assert "line endings: the file has CRLF" in refusal("a\r\nb\r\nc\n", Edit("a\r\nb\n", "y"))


def test_no_match_finds_a_near_miss_by_similarity() -> None:
    text = "".join(f"value_{n} = compute({n})\n" for n in range(100))
    message = refusal(text, Edit("value_42 = compte(42)", "y"))
    assert "line 43" in message and "other characters" in message


def test_nothing_alike_says_so() -> None:
    assert "no similar region" in refusal(PYTHON, Edit("zzzz qqqq", "y"))


def test_lf_old_and_new_strings_match_a_crlf_file_and_keep_its_endings() -> None:
    assert apply_edits("one\r\ntwo\r\nthree\r\n", [Edit("one\ntwo", "1\n2")], "p")[0] == "1\r\n2\r\nthree\r\n"


def test_multi_edit_applies_in_order_each_to_the_result_of_the_one_before() -> None:
    assert apply_edits("a\nb\n", [Edit("a", "b"), Edit("b\nb", "c"), Edit("c", "d")], "p") == ("d\n", 3)


def test_a_failing_edit_of_several_is_named_and_the_text_is_not_used() -> None:
    message = refusal("a\nb\n", Edit("a", "x"), Edit("zz", "y"))
    assert message.startswith("Error: edit 2 of 2: /ws/a.py: old_string not found; ") and message.endswith(
        "; nothing was written"
    )
    message = refusal(PYTHON, Edit("def f", "def h"), Edit("def G():", "y"))
    assert message.splitlines()[0].endswith("it differs in: letter case; nothing was written")


def test_the_diff_is_unified_with_three_lines_of_context_and_real_line_numbers() -> None:
    before = "".join(f"line {n}\n" for n in range(1, 101))
    after = before.replace("line 50\n", "fifty\n")
    diff = unified_diff(before, after, "/ws/f.txt")
    assert diff.splitlines() == [
        "--- /ws/f.txt", "+++ /ws/f.txt", "@@ -47,7 +47,7 @@",
        " line 47", " line 48", " line 49", "-line 50", "+fifty", " line 51", " line 52", " line 53",
    ]  # fmt: skip


def test_the_diff_marks_a_last_line_without_newline() -> None:
    diff = unified_diff("a\nb", "a\nc", "f")
    assert diff.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")


def test_non_ascii_text_is_matched_and_diffed_by_characters() -> None:
    assert apply_edits("café = 'é'\n", [Edit("'é'", "'è'")], "p") == ("café = 'è'\n", 1)
    assert unified_diff("ü\nx\n", "ü\ny\n", "f").endswith(" ü\n-x\n+y\n")


def test_a_lone_surrogate_in_new_string_is_refused() -> None:
    assert "new_string is not valid Unicode" in refusal(PYTHON, Edit("pass", "\ud800"))


def test_the_diff_does_not_split_lines_at_form_feeds() -> None:
    assert unified_diff("a\x0cb\n", "a\x0cc\n", "f").count("\n") == 5


def test_a_10mb_text_is_matched_diagnosed_and_diffed() -> None:
    # How long it takes is measured by `make bench` (file_edit of 10 MB against its floor), not asserted here.
    text = "".join(f"    item_{n} = value({n})\n" for n in range(400_000))  # about 10 MB
    edited, _ = apply_edits(text, [Edit("    item_200000 = value(200000)\n", "    item = 0\n")], "p")
    assert "+    item = 0\n" in unified_diff(text, edited, "p")
    with pytest.raises(ToolFailure, match="trailing whitespace"):
        apply_edits(text, [Edit("    item_300000 = value(300000)   \n", "x")], "p")
    with pytest.raises(ToolFailure, match="line 123457"):
        apply_edits(text, [Edit("item_123456 = valeu(123456)", "x")], "p")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("a\nb\nc\n", "x\nb\nc\n"),  # the first line
        ("a\nb\nc", "a\nb\nz"),  # the last line, without a newline
        ("a\nb\nc\n", "a\nb\nc\nd\n"),  # a line added at the end
        ("".join(f"{n}\n" for n in range(30)), "".join(f"{n}\n" for n in range(30) if n != 15)),  # a line removed
        ("".join(f"{n % 3}\n" for n in range(40)), "".join(f"{n % 3}\n" for n in range(40)).replace("1\n", "one\n")),
        ("p\nqq\nr\n", "p\nq\nr\n"),  # the change ends mid-line
    ],
)
def test_the_diff_over_the_changed_lines_equals_difflibs_over_the_whole_file(before: str, after: str) -> None:
    whole = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile="f", tofile="f", n=3
    )
    expected = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in whole)
    assert unified_diff(before, after, "f") == expected


@pytest.mark.parametrize(("old", "new"), [("b\nc", "B"), ("a", "x\ny"), ("e\n", ""), ("c\nd\ne", "c\nd\ne\nf")])
def test_a_single_edit_kept_as_pieces_diffs_and_joins_like_the_whole_edited_file(old: str, new: str) -> None:
    before = b"a\nb\nc\nd\ne\n"
    applied = edits.apply_edits(before, [Edit(old, new)], "f")
    assert len(applied.pieces) == 3 and applied.data == before.replace(old.encode(), new.encode())
    whole = edits.Applied.of(before, applied.data, 1)
    assert edits.unified_diff(before, applied, "f") == edits.unified_diff(before, whole, "f")
    assert applied.slice(1, 6) == applied.data[1:6]
