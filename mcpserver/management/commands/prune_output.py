"""`manage.py prune_output`: the output-file cleanup the executor also does as it writes, for a daily timer."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from mcpserver.executor.interface import ToolFailure
from mcpserver.executor.remote import ExecutorFault, ExecutorLost
from mcpserver.runtime import get_runtime


class Command(BaseCommand):
    help = (
        "Delete saved command output under <workspace>/.sandstorm/output/ older than 7 days, then the oldest files "
        "until the directory holds under 1 GiB. The executor does the same whenever it saves output; a server with "
        "no traffic relies on this. Done by the executor (the workspace's owner). Safe to re-run."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            summary = asyncio.run(get_runtime().executor.prune_output())
        except (ToolFailure, ExecutorLost, ExecutorFault) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(summary)
