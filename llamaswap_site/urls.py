from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import path, re_path
from django.views.generic import RedirectView

from proxy.api import lease_views, llama_swap_views, model_views, placement_views, profile_views, queue_views, views
from proxy.api.metrics_view import metrics_view
from proxy.batches import views as batch_views
from scheduling.admin.site import overview_page

urlpatterns = [
    # llama-swap's / leads to its UI; here the admin is the UI.
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    re_path(r"^ui(?:/.*)?$", RedirectView.as_view(url="/admin/", permanent=False)),  # llama-swap's UI address
    path("admin/overview/", overview_page, name="admin-overview"),
    path("admin/", admin.site.urls),
    # The admin's CSS and scripts: daphne serves no static files, and a local tool needs no separate web server.
    re_path(r"^static/(?P<path>.*)$", serve_static, {"insecure": True}),
    path("v1/models", model_views.list_models),
    path("models", model_views.list_models),
    path("v1/models/<path:model_id>", model_views.model_entry),
    path("models/<path:model_id>", model_views.model_entry),
    path("running", views.running),
    path("v1/files", batch_views.files),
    path("v1/files/<str:file_id>", batch_views.file_entry),
    path("v1/files/<str:file_id>/content", batch_views.file_content),
    path("v1/batches", batch_views.batches),
    path("v1/batches/<str:batch_id>", batch_views.batch_entry),
    path("v1/batches/<str:batch_id>/cancel", batch_views.batch_cancel),
    path("unload", views.unload_all_legacy),
    path("api/models/unload", views.unload_all),
    path("api/models/unload/<path:model>", views.unload_model),
    path("api/activity", views.activity),
    path("api/metrics/activity", llama_swap_views.metrics_activity),
    path("api/metrics/stats", llama_swap_views.metrics_stats),
    path("api/captures/<str:capture_id>", llama_swap_views.capture),
    path("api/version", llama_swap_views.version),
    path("api/events", views.api_events),
    path("api/profiles", profile_views.profiles),
    path("api/profiles/active", profile_views.activate_profile),
    path("api/leases", lease_views.leases),
    path("api/leases/<int:lease_id>", lease_views.lease),
    path("api/placement", placement_views.placement),
    path("api/placement/can-load/<path:model>", placement_views.can_load),
    path("api/queue", queue_views.queue),
    path("api/queue/<int:ticket_id>", queue_views.queue_entry),
    path("api/inflight/<int:ticket_id>/cancel", queue_views.cancel_inflight),
    path("logs", views.logs),
    path("logs/stream", views.logs_stream),
    path("logs/stream/<path:model>", views.logs_stream),
    path("metrics", metrics_view, name="prometheus-django-metrics"),
]

handler400 = "proxy.api.views.bad_request"
handler404 = "proxy.api.views.not_found"
handler500 = "proxy.api.views.server_error"
