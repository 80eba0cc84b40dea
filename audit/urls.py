"""Audit pages beside the admin's own, mounted at /admin/audit/ before admin.site.urls; all staff-only."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from audit import recording_views, views

app_name = "audit"

urlpatterns = [
    path("calls/<str:call_id>/", admin.site.admin_view(recording_views.call_page), name="call_page"),
    path("overview/", admin.site.admin_view(views.overview), name="overview"),
    path("auditrecord/export.csv", admin.site.admin_view(views.export_csv), name="export_csv"),
    path("auditrecord/export.jsonl", admin.site.admin_view(views.export_jsonl), name="export_jsonl"),
    path(
        "calls/<str:call_id>/recording.json",
        admin.site.admin_view(recording_views.recording_events),
        name="recording_events",
    ),
    path(
        "calls/<str:call_id>/recording.cast",
        admin.site.admin_view(recording_views.recording_cast),
        name="recording_cast",
    ),
]
