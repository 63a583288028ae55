"""`GET /metrics`: the Prometheus export, behind the API keys when `metricsRequireApiKey: true`."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django_prometheus.exports import ExportToDjangoView
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.http.access import Denied
from proxy.http.key_cache import caller_of_now
from proxy.http.errors import error_body
from proxy.http.responses import allow_methods
from proxy.service import load_configured
from scheduling.door import frontdoor
from scheduling import metrics


@csrf_exempt
@allow_methods("GET", "HEAD")
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = refusal({name.lower(): value for name, value in request.headers.items()})
    if refused is not None:
        response = HttpResponse(refused, status=401, content_type="application/json")
        response["WWW-Authenticate"] = 'Basic realm="llamaswap"'
        return response
    only = metrics.EXPORT.only
    if only is not None:  # a front end: the worker exports the scheduler's series
        return HttpResponse(generate_latest(only), content_type=CONTENT_TYPE_LATEST)
    return ExportToDjangoView(request)


def refusal(headers: Mapping[str, str]) -> bytes | None:
    """The 401 body for a scrape without a valid API key while `metricsRequireApiKey` is on, else None.
    A worker's metrics port applies the same rule (`proxy.api.worker_metrics`); `headers` have lower-case names."""
    config = _served_config()
    if config is None or not config.metrics_require_api_key:
        return None
    caller = caller_of_now(headers, config.api_keys)
    if not isinstance(caller, Denied):
        return None
    return error_body(401, f"/metrics needs an API key (metricsRequireApiKey is on): {caller.message}", caller.code)


def _served_config():
    """The config of the running service; before one exists (served by plain daphne), the configured file."""
    door = frontdoor.installed()
    if door is not None:
        return door.config
    if settings.LLAMASWAP_CONFIG or settings.LLAMASWAP_CONFIG_DIR:
        return load_configured()
    return None
