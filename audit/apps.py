from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit log"

    def ready(self) -> None:
        from audit import signals  # noqa: F401  (connects the login receivers)
        from audit.log import writer

        writer.configure()  # from the settings as they are now; tests may configure another
