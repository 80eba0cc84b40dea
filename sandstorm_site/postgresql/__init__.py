"""Django's PostgreSQL backend, recovering from lost connections outside requests (see base.py)."""
