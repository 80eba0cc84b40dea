"""`python -m bench.redaction`: how long a call's output takes to become its finished record's excerpt (audit/excerpt.py:
the head and the tail kept, each redacted, and the whole hashed), for outputs of 16 KB as commands print them.

The outputs are built here, the same in every run: Python source (a file of the pinned Django), a process list, JSON,
a web server's log, and an environment listing with secrets in it (what redaction masks). Prints the best of several
rounds in microseconds per output; no server, no database.
"""

from __future__ import annotations

import json
import random
import statistics
import timeit
from pathlib import Path
from typing import Any

import django

from audit.excerpt import excerpt

OUTPUT_BYTES = 16384
EXCERPT_BYTES = 8192  # the default SANDSTORM_AUDIT_EXCERPT: an output of 16 KB is kept whole, and redacted whole


def _repeated(lines: list[str]) -> str:
    text = ""
    while len(text) < OUTPUT_BYTES:
        text += "\n".join(lines) + "\n"
    return text[:OUTPUT_BYTES]


def outputs() -> dict[str, str]:
    chooser = random.Random(6)
    programs = ["/usr/bin/python3 -m http.server 8000", "/usr/sbin/sshd -D", "nginx: worker process", "bash"]
    processes = [
        f"root {chooser.randint(1, 99999):>7} 0.{chooser.randint(0, 9)} 0.1 {chooser.randint(10**4, 10**6):>8} "
        f"{chooser.randint(10**3, 10**5):>6} ?        Ss   10:{chooser.randint(10, 59)}   0:00 {chooser.choice(programs)}"
        for _ in range(200)
    ]
    packages = [
        {"name": f"package-{index}", "version": f"{index % 7}.{index % 13}.{index % 3}"} for index in range(400)
    ]
    log = [
        f'10.0.0.{chooser.randint(1, 254)} - - [06/Dec/2026:10:{chooser.randint(10, 59)}:00 +0000] "GET '
        f'/static/app-{chooser.randint(1, 999)}.js HTTP/1.1" 200 {chooser.randint(100, 99999)} "-" "Mozilla/5.0"'
        for _ in range(200)
    ]
    environment = [f"VARIABLE_{index}=/usr/local/lib/value-{index}" for index in range(150)]
    environment[::15] = [f"SERVICE_{index}_TOKEN=sk-{'a1b2c3d4e5' * 3}" for index in range(10)]
    source = (Path(django.__file__).parent / "db" / "models" / "base.py").read_text()
    return {
        "Python source": source[:OUTPUT_BYTES],
        "process list": _repeated(processes),
        "JSON": json.dumps(packages)[:OUTPUT_BYTES],
        "web server log": _repeated(log),
        "environment with secrets": _repeated(environment),
    }


def per_output(text: str) -> float:
    """The best of 5 rounds of 20, in microseconds per output."""
    return min(timeit.repeat(lambda: excerpt(text, EXCERPT_BYTES), number=20, repeat=5)) / 20 * 1e6


def measure() -> dict[str, Any]:
    """The excerpt's cost per output for `make bench`: each output's best of 5 rounds, and their median."""
    each = {name: round(per_output(text), 1) for name, text in outputs().items()}
    return {
        "output_bytes": OUTPUT_BYTES,
        "outputs": each,
        "median_us": round(statistics.median(each.values()), 1),
        "max_us": max(each.values()),
    }


def main() -> None:
    found = measure()
    print(f"excerpt of a {found['output_bytes']:,}-byte output, µs per output, best of 5 rounds")
    for name, cost in found["outputs"].items():
        print(f"{cost:>9} {name}")


if __name__ == "__main__":
    main()
