"""`manage.py prune_output`: the output-file cleanup the server also does as it writes, for a daily timer."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from mcpserver.executor.capture import MAX_AGE_SECONDS, MAX_DIR_BYTES, prune_output_dir
from mcpserver.executor.paths import OUTPUT_SUBDIR, SANDSTORM_DIR


class Command(BaseCommand):
    help = (
        "Delete saved command output under <workspace>/.sandstorm/output/ older than 7 days, then the oldest files "
        "until the directory holds under 1 GiB. The server does the same whenever it saves output; a server with "
        "no traffic relies on this. Safe to re-run."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        directory = settings.WORKSPACE_ROOT / SANDSTORM_DIR / OUTPUT_SUBDIR
        if not directory.is_dir():
            self.stdout.write(f"Nothing to prune: {directory} does not exist.")
            return
        before = [path for path in directory.iterdir() if path.is_file()]
        prune_output_dir(directory, max_age=MAX_AGE_SECONDS, max_bytes=MAX_DIR_BYTES)
        removed = sum(1 for path in before if not path.exists())
        self.stdout.write(f"Pruned {directory}: {removed} of {len(before)} files removed.")
