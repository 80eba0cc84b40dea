#!/usr/bin/env python3
"""Django's command-line utility for Sandstorm."""

import importlib
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandstorm_site.settings")
    from django.core.exceptions import ImproperlyConfigured

    try:
        importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
    except ImproperlyConfigured as exc:
        # One line naming the variable, not a traceback.
        print(f"sandstorm: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
