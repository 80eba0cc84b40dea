"""Second-factor devices have no admin pages: they are made by the sign-in steps and removed by
`manage.py reset_second_factor`, both recorded in the audit log. django-otp's own pages would let a superuser
delete (or add) one with no record."""

from __future__ import annotations

from django.contrib import admin
from django_otp.plugins.otp_static.models import StaticDevice
from django_otp.plugins.otp_totp.models import TOTPDevice

for model in (TOTPDevice, StaticDevice):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
