"""The per-credential limits and the byte cap on results."""

from __future__ import annotations

import json

from mcp_types import ImageContent, TextContent

from mcpserver.executor.textsize import json_size
from mcpserver.limits import ConcurrencyLimiter, RateLimiter
from mcpserver.results import Image, ToolResult, fit_structured, fit_text, render


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_limiter_allows_n_a_minute_per_credential_then_says_how_long_to_wait() -> None:
    clock = FakeClock()
    limiter = RateLimiter(3, clock=clock)
    assert [limiter.check("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.check("a")
    assert 59 < wait <= 60
    assert limiter.check("b") == 0.0
    clock.now += 60
    assert limiter.check("a") == 0.0


def test_a_rate_limit_of_zero_turns_it_off() -> None:
    limiter = RateLimiter(0)
    assert all(limiter.check("a") == 0.0 for _ in range(10_000))


def test_the_concurrency_limiter_refuses_over_the_limit_and_frees_on_release() -> None:
    limiter = ConcurrencyLimiter(2)
    assert limiter.try_acquire("a") and limiter.try_acquire("a")
    assert not limiter.try_acquire("a")
    assert limiter.try_acquire("b")
    limiter.release("a")
    assert limiter.try_acquire("a")


def test_fit_text_keeps_head_and_tail_within_the_budget() -> None:
    text = "HEAD" + "x" * 100_000 + "TAIL"
    cut = fit_text(text, 10_000, "the rest is in /ws/out.log")
    assert json_size(cut) <= 10_000
    assert cut.startswith("HEAD") and cut.endswith("TAIL")
    assert "characters omitted; the rest is in /ws/out.log" in cut


def test_fit_text_counts_json_escaping() -> None:
    text = "\x01" * 50_000  # six bytes each once escaped
    assert json_size(fit_text(text, 20_000)) <= 20_000


def test_render_caps_the_serialized_result_with_its_structured_copy() -> None:
    out = "y" * 400_000
    result = ToolResult(text=out, structured={"stdout": out})
    rendered = render(result, 262_144)
    assert len(rendered.model_dump_json(by_alias=True).encode()) <= 262_144
    assert rendered.structured_content is None  # a copy that large is dropped, the text is kept (cut)


def test_render_keeps_a_small_result_whole() -> None:
    rendered = render(ToolResult(text="ok", structured={"exit_code": 0}), 262_144)
    block = rendered.content[0]
    assert isinstance(block, TextContent) and block.text == "ok" and rendered.structured_content == {"exit_code": 0}
    assert json.loads(rendered.model_dump_json(by_alias=True))["isError"] is False


def test_render_never_drops_the_structured_copy_of_a_tool_with_an_output_schema() -> None:
    structured = {"matches": 3, "note": "z" * 100_000}  # over half the budget: a tool without a schema loses it
    rendered = render(ToolResult(text="t" * 400_000, structured=structured), 262_144, keep_structured=True)
    assert rendered.structured_content == structured
    assert len(rendered.model_dump_json(by_alias=True).encode()) <= 262_144


def test_a_typed_copy_too_large_beside_the_text_is_cut_and_the_text_is_sent_as_it_would_be_alone() -> None:
    out = 'print("x")  # \\ path\n' * 6_000  # quotes and backslashes: once escaped, each copy is over half the room
    structured = {"stdout": out, "stderr": "", "exit_code": 0, "output_path": "/output/exec.stdout.log"}
    result = ToolResult(text=f"stdout:\n{out}\nexit_code: 0", structured=structured)
    rendered = render(result, 262_144, keep_structured=True)
    assert rendered.content == render(ToolResult(text=result.text), 262_144).content
    copy = rendered.structured_content
    assert copy is not None and set(copy) == set(structured)
    assert (copy["exit_code"], copy["stderr"], copy["output_path"]) == (0, "", "/output/exec.stdout.log")
    assert copy["stdout"].startswith('print("x")') and "characters omitted" in copy["stdout"]
    assert len(rendered.model_dump_json(by_alias=True).encode()) <= 262_144


def test_fit_structured_cuts_the_longest_strings_to_one_length_and_keeps_the_rest() -> None:
    structured = {"a": "x" * 10_000, "b": ["y" * 50, "z" * 20_000], "n": 1, "ok": True}
    fitted = fit_structured(structured, 8_000)
    assert len(json.dumps(fitted, ensure_ascii=False).encode()) <= 8_000
    assert (fitted["b"][0], fitted["n"], fitted["ok"]) == ("y" * 50, 1, True)
    assert "characters omitted" in fitted["a"] and "characters omitted" in fitted["b"][1]
    assert abs(json_size(fitted["a"]) - json_size(fitted["b"][1])) < 16
    assert structured["a"] == "x" * 10_000  # a copy is cut, never what the tool returned
    assert fit_structured(structured, 100_000) is structured


def test_render_sends_images_as_image_content_and_fits_the_text_beside_them() -> None:
    data = "A" * 200_000
    rendered = render(ToolResult(text="x" * 400_000, images=[Image(data, "image/png")]), 262_144)
    text, image = rendered.content
    assert isinstance(text, TextContent) and isinstance(image, ImageContent)
    assert image.data == data and image.mime_type == "image/png"
    assert len(rendered.model_dump_json(by_alias=True).encode()) <= 262_144
