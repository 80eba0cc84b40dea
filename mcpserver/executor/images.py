"""Reading an image file whole, for the tools to return as image content rather than as a note on a binary file.

An image is known by its first bytes, never by its name: a `.png` holding text is read as text, and a `.txt`
holding a PNG comes back as the picture it is.
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any, BinaryIO

from mcpserver.executor.paging import check_page_args, open_regular, read_page
from mcpserver.executor.paths import Workspace

MAGIC_BYTES = 12  # enough for the longest signature: RIFF, a 4-byte size, WEBP


def image_type(head: bytes) -> str | None:
    """The MIME type of a PNG, JPEG, GIF or WebP file beginning with `head`, or None for anything else."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _read_capped(f: BinaryIO, max_bytes: int) -> bytes | None:
    """The whole file if it has at most `max_bytes` bytes, else None; never holds more than `max_bytes` + 1."""
    if os.fstat(f.fileno()).st_size > max_bytes:
        return None
    f.seek(0)
    raw = f.read(max_bytes + 1)  # the file may have grown since fstat
    return raw if len(raw) <= max_bytes else None


def read_image(workspace: Workspace, path: str, max_bytes: int) -> dict[str, Any] | None:
    """The image at `path` as {path, mime, size, data}, `data` its base64 or None when it has more than `max_bytes`
    bytes; None if the file is not an image. Fails as a read does for a missing file, a directory or a FIFO."""
    real = workspace.resolve(path)
    with open_regular(workspace, real) as f:
        mime = image_type(f.read(MAGIC_BYTES))
        if mime is None:
            return None
        raw = _read_capped(f, max_bytes)
        size = len(raw) if raw is not None else max(os.fstat(f.fileno()).st_size, max_bytes + 1)
    data = base64.b64encode(raw).decode("ascii") if raw is not None else None
    return {"path": str(real), "mime": mime, "size": size, "data": data}


class ImageOps:
    """Images for file_read; composed into LocalExecutor, which sets `workspace`."""

    workspace: Workspace

    async def read_file_or_image(
        self,
        path: str,
        offset: int | None,
        limit: int | None,
        max_bytes: int,
        line_numbers: bool,
        image_max_bytes: int,
    ) -> dict[str, Any]:
        check_page_args(offset, limit)
        return await asyncio.to_thread(self._read_any, path, offset, limit, max_bytes, line_numbers, image_max_bytes)

    def _read_any(
        self, path: str, offset: int | None, limit: int | None, max_bytes: int, numbered: bool, image_max_bytes: int
    ) -> dict[str, Any]:
        # Both in one executor call: a text read costs no second round trip for asking whether it is an image.
        image = read_image(self.workspace, path, image_max_bytes)
        if image is not None:
            return {"image": image}
        return {"text": read_page(self.workspace, path, offset or 1, limit, max_bytes, numbered)}

    async def read_image(self, path: str, max_bytes: int) -> dict[str, Any] | None:
        """`read_image` in a thread (for tests and local callers; not an executor operation)."""
        return await asyncio.to_thread(read_image, self.workspace, path, max_bytes)
