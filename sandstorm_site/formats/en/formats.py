"""One date format across the console, naming its zone: "2026-12-07 15:04:05 UTC", in settings.TIME_ZONE. The
admin's own cells and fields use it, templates write `|date:"DATETIME_FORMAT"`, and the lists' cells
oauth.console_lists.moment."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
