"""Jobs on a benchmark server's database, each in one process with that server's environment (a Python start-up
costs seconds here, so each job does all it can at once).

    python -m bench.dbtask prepare                 bootstrap, then the admin's password from SANDSTORM_ADMIN_PASSWORD
    python -m bench.dbtask audit-check SESSION...  JSON: the records of each session by kind, and audit_verify's verdict
    python -m bench.dbtask tokens PREFIX COUNT     JSON: COUNT new bearer tokens of the admin (PREFIX-1...), their secrets
    python -m bench.dbtask seed COUNT [--batch N] [--random-seed S]
                                                   COUNT fake, correctly chained audit records (bench/seed.py)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys


def prepare() -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("bootstrap", stdout=io.StringIO())
    user = get_user_model().objects.get(username="admin")  # a cached database may hold an admin already
    user.set_password(os.environ["SANDSTORM_ADMIN_PASSWORD"])
    user.save(update_fields=["password"])


def audit_check(sessions: list[str]) -> dict[str, object]:
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db.models import Count

    from audit.models import AuditRecord

    counts: dict[str, dict[str, int]] = {session: {} for session in sessions}
    rows = AuditRecord.objects.filter(session_id__in=sessions).values("session_id", "kind").annotate(n=Count("id"))
    for row in rows.order_by():
        counts[row["session_id"]][row["kind"]] = row["n"]
    out = io.StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=io.StringIO())
        verdict, ok = out.getvalue().strip(), True
    except CommandError as error:
        verdict, ok = str(error), False
    return {"counts": counts, "verify_ok": ok, "verify": verdict}


def tokens(prefix: str, count: int) -> list[str]:
    """`count` tokens in one process: `manage.py create_token` costs a Python start-up each (seconds here)."""
    from django.contrib.auth import get_user_model

    from oauth.tokens import issue_token, shell_actor

    admin = get_user_model().objects.get(username="admin")
    return [issue_token(admin, f"{prefix}-{number}", by=shell_actor())[1] for number in range(1, count + 1)]


def seed(argv: list[str]) -> str:
    from bench.seed import seed as seed_records

    parser = argparse.ArgumentParser(prog="python -m bench.dbtask seed")
    parser.add_argument("count", type=int, help="how many records to add (a call is two records)")
    parser.add_argument("--batch", type=int, default=5000, help="records per transaction (default: 5000)")
    parser.add_argument("--random-seed", type=int, default=None, help="make the content reproducible")
    options = parser.parse_args(argv)
    return seed_records(options.count, options.batch, options.random_seed)


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandstorm_site.settings")
    import django

    django.setup()
    command, args = argv[0], argv[1:]
    if command == "prepare":
        prepare()
    elif command == "audit-check":
        json.dump(audit_check(args), sys.stdout)
    elif command == "tokens":
        json.dump(tokens(args[0], int(args[1])), sys.stdout)
    elif command == "seed":
        print(seed(args))
    else:
        print(f"unknown task {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
