"""Server instances, and the calls an instance started but never finished because it was killed."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from django.db import IntegrityError
from django.utils import timezone

from audit.log import call_finished
from audit.models import KIND_STARTED, OUTCOME_INTERRUPTED, AuditRecord, ServerInstance

logger = logging.getLogger(__name__)
# An instance that has not checked in for this long is presumed gone (heartbeats come every minute).
HEARTBEAT_STALE = timedelta(minutes=3)


def register_instance(instance_id: str) -> None:
    ServerInstance.objects.update_or_create(
        pk=instance_id, defaults={"hostname": socket.gethostname(), "pid": os.getpid(), "last_seen": timezone.now()}
    )


def heartbeat(instance_id: str) -> None:
    ServerInstance.objects.filter(pk=instance_id).update(last_seen=timezone.now())


def mark_stopped(instance_id: str) -> None:
    ServerInstance.objects.filter(pk=instance_id).update(stopped_at=timezone.now(), last_seen=timezone.now())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_alive(instance: ServerInstance) -> bool:
    if instance.stopped_at is not None:
        return False
    if timezone.now() - instance.last_seen > HEARTBEAT_STALE:
        return False
    # Same host: the process table is the truth. Another host: trust its fresh heartbeat.
    return instance.hostname != socket.gethostname() or _pid_alive(instance.pid)


def recover_interrupted(current_instance: str) -> int:
    """Finish, as `interrupted`, every call started by an instance that is no longer running. Returns the count."""
    unfinished = AuditRecord.objects.filter(kind=KIND_STARTED, finished_record__isnull=True).exclude(
        instance_id=current_instance
    )
    instances = {
        instance.pk: instance for instance in ServerInstance.objects.filter(pk__in=unfinished.values("instance_id"))
    }
    count = 0
    for started in unfinished.order_by("id").iterator():
        instance = instances.get(started.instance_id)
        if instance is not None and is_alive(instance):
            continue  # still running in another process
        try:
            call_finished(
                started,
                OUTCOME_INTERRUPTED,
                reason="the server process running this call stopped before its end was recorded",
                instance_id=current_instance,
            )
        except IntegrityError:  # finished meanwhile by another server process starting at the same moment
            continue
        count += 1
    if count:
        logger.warning("marked %d call(s) of stopped server instances as interrupted", count)
    return count
