"""The bench's audit seeder (bench/seed.py): records that audit_verify accepts, after those already there."""

from __future__ import annotations

import io
import random
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit.log import event
from audit.models import AuditRecord
from bench.dbtask import seed as seed_task
from bench.seed import generate, seed

OK_LINE = re.compile(r"^OK: (\d+) records checked, chain intact \(head: record (\d+)\)$", re.MULTILINE)


def verify() -> str:
    out = io.StringIO()
    call_command("audit_verify", stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_the_seeder_adds_n_records_that_audit_verify_accepts() -> None:
    event("before.seed")
    assert seed(301, batch=64).startswith("Seeded 301 audit records")
    assert AuditRecord.objects.count() == 302
    assert AuditRecord.objects.filter(kind="call.finished", started__isnull=False).count() > 100
    assert len(set(AuditRecord.objects.values_list("tool", flat=True))) > 5
    newest = AuditRecord.objects.order_by("-id").first()
    match = OK_LINE.search(verify())
    assert newest is not None and match is not None and match.groups() == ("302", str(newest.id))


@pytest.mark.django_db
def test_the_seeders_records_come_after_the_newest_one() -> None:
    before = event("before.seed")
    seed(50, batch=16)
    seeded = AuditRecord.objects.exclude(pk=before.pk)
    assert seeded.count() == 50 and not seeded.filter(created_at__lt=before.created_at).exists()


def test_the_same_random_seed_gives_the_same_records() -> None:
    start, end = timezone.now() - timedelta(days=1), timezone.now()

    def made(random_seed: int) -> list[tuple[object, ...]]:
        return [(item.record["tool"], item.record["outcome"], item.record["call_id"], item.record["created_at"])
                for item in generate(40, start, end, random.Random(random_seed))]  # fmt: skip

    assert made(6) == made(6) != made(7)


@pytest.mark.django_db
def test_the_bench_task_parses_its_arguments_and_seeds() -> None:
    assert seed_task(["20", "--batch", "7", "--random-seed", "1"]).startswith("Seeded 20 audit records")
    assert AuditRecord.objects.count() == 20


def test_a_count_or_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        seed(0)
    with pytest.raises(ValueError, match="at least 1"):
        seed(10, batch=0)
