"""`manage.py prune_output`: the output-file cleanup for a daily timer (the executor drops files past their age as
it measures the directory, and never goes over the budget)."""

from __future__ import annotations

import asyncio
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from mcpserver.executor.interface import ExecutorError
from mcpserver.services import build_executor


class Command(BaseCommand):
    help = (
        "Delete saved command output (in the executor's own directory, SANDSTORM_OUTPUT_DIR) older than 7 days, "
        "then the oldest files until the directory is within its budget (SANDSTORM_OUTPUT_MAX_BYTES), or within --max-bytes. When the "
        "budget is full, new output is not saved until room is freed. Done by the executor (the workspace's "
        "owner). Safe to re-run."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--max-bytes",
            type=int,
            default=None,
            help="leave at most this many bytes (default: the budget); 0 empties it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        max_bytes = options["max_bytes"]
        if max_bytes is not None and max_bytes < 0:
            raise CommandError("--max-bytes must be 0 or more")
        executor, child = build_executor()
        try:
            summary = asyncio.run(executor.prune_output(max_bytes))
        except ExecutorError as error:
            raise CommandError(str(error)) from error
        finally:
            if child is not None:
                child.stop()
        self.stdout.write(summary)
