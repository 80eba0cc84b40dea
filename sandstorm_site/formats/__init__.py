"""The console's date formats (settings.FORMAT_MODULE_PATH): Django's English ones would win over a DATETIME_FORMAT
setting."""
