"""`GET /metrics`: the Prometheus export, behind the API keys when `metricsRequireApiKey: true`; then a key that is
not an operator's reads the series of its models and its own key only (`proxy.api.visibility.shown_series`)."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django_prometheus.exports import ExportToDjangoView
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.api.visibility import shown_series
from proxy.serving.access import Caller, Denied
from proxy.serving.key_cache import caller_of_now
from proxy.serving.errors import error_body
from proxy.api.responses import allow_methods
from proxy.service import load_configured
from scheduling.door import frontdoor
from scheduling import metrics


@csrf_exempt
@allow_methods("GET", "HEAD")
def metrics_view(request: HttpRequest) -> HttpResponse:
    caller = scraper({name.lower(): value for name, value in request.headers.items()})
    if isinstance(caller, Denied):
        response = HttpResponse(_refusal_body(caller), status=401, content_type="application/json")
        response["WWW-Authenticate"] = 'Basic realm="llamaswap"'
        return response
    only = metrics.EXPORT.only
    if only is not None:  # a front end: the worker exports the scheduler's series
        response = HttpResponse(generate_latest(only), content_type=CONTENT_TYPE_LATEST)
    else:
        response = ExportToDjangoView(request)
    if caller is not None:
        response.content = shown_series(caller.scope, response.content)
    return response


def scraper(headers: Mapping[str, str]) -> Caller | Denied | None:
    """Whose key a scrape shows while `metricsRequireApiKey` is on (Denied: none valid), else None: anyone reads
    every series. `headers` have lower-case names."""
    config = _served_config()
    if config is None or not config.metrics_require_api_key:
        return None
    return caller_of_now(headers, config.api_keys)


def refusal(headers: Mapping[str, str]) -> bytes | None:
    """The 401 body for a scrape without a valid API key while `metricsRequireApiKey` is on, else None.
    A worker's metrics port applies the same rule (`proxy.api.worker_metrics`)."""
    caller = scraper(headers)
    return _refusal_body(caller) if isinstance(caller, Denied) else None


def _refusal_body(denied: Denied) -> bytes:
    return error_body(401, f"/metrics needs an API key (metricsRequireApiKey is on): {denied.message}", denied.code)


def _served_config():
    """The config of the running service; before one exists (served by plain daphne), the configured file."""
    door = frontdoor.installed()
    if door is not None:
        return door.config
    if settings.LLAMASWAP_CONFIG or settings.LLAMASWAP_CONFIG_DIR:
        return load_configured()
    return None
