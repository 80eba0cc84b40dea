"""The audit chain in the database, on SQLite and (with DATABASE_URL) PostgreSQL: concurrent writers, values that
PostgreSQL would refuse or change, and server processes that start at the same moment."""

from __future__ import annotations

import itertools
import math
import multiprocessing
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from audit import instances, log
from audit.log import Actor, call_finished, call_started, event
from audit.models import KIND_FINISHED, AuditRecord, ChainHead, ServerInstance

WRITERS = 8


def write_at_once(count: int, write: Callable[[int], object]) -> list[str]:
    """Run `write(number)` in `count` processes released together, as server processes would write; returns what
    they raised. Processes, not threads: each has its own connection and nothing in Python orders them."""
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(count), context.Queue()

    def run(number: int) -> None:
        try:
            connection.ensure_connection()  # connected before the start, so all begin within a moment
            barrier.wait(timeout=30)
            write(number)
        except BaseException as error:  # noqa: BLE001 - reported to the test, which fails on any
            errors.put(repr(error))
        finally:
            connection.close()

    connections.close_all()  # a forked child must not share the parent's connection
    processes = [context.Process(target=run, args=(number,)) for number in range(count)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * count
    found = []
    while not errors.empty():
        found.append(errors.get())
    return found


def assert_one_unforked_chain(expected: int) -> None:
    records = list(AuditRecord.objects.order_by("id").values_list("id", "prev_mac", "mac"))
    assert len(records) == expected
    assert records[0][1] == log.GENESIS_MAC
    assert all(current[1] == previous[2] for previous, current in itertools.pairwise(records))
    head = ChainHead.objects.get()
    assert (head.last_record_id, head.mac) == (records[-1][0], records[-1][2])
    result = log.verify()
    assert result.ok and result.checked == expected, result


@pytest.mark.django_db(transaction=True)
def test_writers_starting_an_empty_chain_at_once_all_chain_from_one_genesis() -> None:
    """Without a head row there is nothing to lock: the first writers must still wait for each other."""
    assert write_at_once(WRITERS, lambda number: event("first", writer=number)) == []
    assert_one_unforked_chain(WRITERS)


@pytest.mark.django_db(transaction=True)
def test_many_writers_at_once_keep_one_chain() -> None:
    event("genesis")

    def calls(number: int) -> None:
        for call_no in range(5):
            started = call_started(
                Actor(username=f"writer-{number}"), "terminal_exec", {"command": f"echo {call_no}"}, "test"
            )
            call_finished(started, "ok", result_text=str(call_no), exit_code=0, duration_ms=1)

    assert write_at_once(WRITERS, calls) == []
    assert_one_unforked_chain(1 + WRITERS * 5 * 2)


@pytest.mark.django_db
def test_values_postgresql_would_refuse_or_change_are_stored_as_every_database_keeps_them() -> None:
    actor = Actor(username="nul\x00user", user_agent="agent\x00")
    arguments = {"command": "printf 'a\\0b'\x00", "timeout": 1e20, "nested": {"key\x00": [-0.0, 1.5e-20, 2.5]}}
    started = call_started(actor, "terminal_exec", arguments, "test")
    call_finished(started, "ok", result_text="out\x00put", exit_code=0, duration_ms=3)
    event("odd.numbers", actor, values=[math.nan, math.inf, -math.inf, 12345678901234567890.0, 30.0])

    stored = {record.kind: record for record in AuditRecord.objects.all()}
    assert stored["call.started"].username == "nul\ufffduser" and stored["call.started"].user_agent == "agent\ufffd"
    assert stored["call.started"].arguments == {
        "command": "printf 'a\\0b'\ufffd",
        "timeout": 10**20,
        "nested": {"key\ufffd": [0.0, 1.5e-20, 2.5]},
    }
    assert stored[KIND_FINISHED].result_excerpt == "out\ufffdput"
    assert stored["event"].detail == {"values": ["nan", "inf", "-inf", 12345678901234567168, 30.0]}
    assert isinstance(stored["event"].detail["values"][4], float)
    assert log.verify().ok


@pytest.mark.django_db
def test_a_call_another_starting_process_already_marked_interrupted_is_left_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two server processes starting together both find the calls of a dead one; the slower finds them finished."""
    long_ago = timezone.now() - timedelta(hours=1)
    ServerInstance.objects.create(pk="dead", hostname="elsewhere", pid=1, started_at=long_ago, last_seen=long_ago)
    started = call_started(Actor(username="alice"), "terminal_exec", {"command": "sleep 600"}, "dead")
    real_finish = instances.call_finished

    def the_other_process_was_first(record: AuditRecord, *args: Any, **kwargs: Any) -> AuditRecord:
        real_finish(record, *args, **{**kwargs, "instance_id": "other"})
        return real_finish(record, *args, **kwargs)

    monkeypatch.setattr(instances, "call_finished", the_other_process_was_first)
    assert instances.recover_interrupted("current") == 0
    finished = AuditRecord.objects.get(started=started)
    assert (finished.outcome, finished.instance_id) == ("interrupted", "other")
    assert log.verify().ok
