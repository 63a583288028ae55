"""Django settings, read from the environment (12-factor).

LLAMASWAP_DATA_DIR   where the SQLite file and the generated SECRET_KEY live (default ./data)
LLAMASWAP_FILES_DIR  where the Files API keeps files (default <data dir>/files); front ends share one folder
DATABASE_URL         optional postgres://user@host:port/name for scale-out; SQLite otherwise
LLAMASWAP_SECRET_KEY optional: the SECRET_KEY, for front ends that must share one (sessions); else generated
LLAMASWAP_DEBUG      "1" turns Django's DEBUG on (off by default)
LLAMASWAP_ALLOWED_HOSTS  comma-separated Host names accepted (default: localhost names only; `*`: any);
                     `llamaswap serve` adds the machine's own names when it listens beyond loopback
LLAMASWAP_HTTPS      "1" when served behind a TLS proxy: Secure cookies, HSTS, redirect to HTTPS
LLAMASWAP_CONFIG     path of the llama-swap config.yaml (set by `llamaswap serve --config`)
LLAMASWAP_CONFIG_DIR a directory whose *.yaml files are merged after it (set by `llamaswap serve --config-dir`)
REDIS_URL            optional redis://host:port/db: distributed mode (front ends + `llamaswap worker`),
                     with a PostgreSQL DATABASE_URL
LLAMASWAP_CHANNEL_LAYER  "lists" (default: messages wait in Redis until read) or "pubsub" (fewer round trips)
LLAMASWAP_LOGIN_FAILURE_LIMIT   wrong admin passwords in a row, per user name and address, before logins are
                     refused (default 5)
LLAMASWAP_LOGIN_COOLOFF_SECONDS how long they are refused after the last try (default 900)
LLAMASWAP_TRUSTED_PROXIES       comma-separated addresses of reverse proxies whose X-Forwarded-For names the
                     client (llamaswap_site/client_ip.py); default none: the TCP peer is the client
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from llamaswap_site.environment import channel_layers_from_url, database_from_url, load_or_create_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("LLAMASWAP_DATA_DIR", "data")).resolve()
# Private to the service's user: it holds the secret key and the request history.
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)

# The Files API's files (batch inputs and outputs): with several front ends, a folder they all mount.
FILES_DIR = Path(os.environ.get("LLAMASWAP_FILES_DIR", "") or DATA_DIR / "files").resolve()

SECRET_KEY = load_or_create_secret_key(DATA_DIR / "secret_key", os.environ.get("LLAMASWAP_SECRET_KEY", ""))
DEBUG = os.environ.get("LLAMASWAP_DEBUG", "") == "1"
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("LLAMASWAP_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if h.strip()
]

LLAMASWAP_CONFIG = os.environ.get("LLAMASWAP_CONFIG", "")
LLAMASWAP_CONFIG_DIR = os.environ.get("LLAMASWAP_CONFIG_DIR", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "django_prometheus",
    "channels",
    "scheduling",
    "proxy",
]

MIDDLEWARE = [
    # First: /health answers any Host, and unknown Host names get the JSON error naming LLAMASWAP_ALLOWED_HOSTS.
    "proxy.http.hosts.host_check_middleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # A view that raised because the scheduler or the database is away: 503 with Retry-After, not a 500.
    "proxy.api.unavailable.UnavailableMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "llamaswap_site.urls"
ASGI_APPLICATION = "llamaswap_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(os.environ.get("DATABASE_URL", ""), DATA_DIR / "llamaswap.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Distributed mode when REDIS_URL is set: front ends reach the scheduler worker over the channel layer.
# Without it there is no layer (a layer makes every consumer open a channel of its own) and the
# scheduler runs in the serving process. See scheduling/door/frontdoor.py.
CHANNEL_LAYERS = channel_layers_from_url(
    os.environ.get("REDIS_URL", ""), DATABASES["default"], os.environ.get("LLAMASWAP_CHANNEL_LAYER", "lists")
)
LLAMASWAP_SCHEDULER_FRONT_DOOR = (
    "scheduling.door.remote.ChannelLayerFrontDoor" if CHANNEL_LAYERS else "scheduling.door.in_process.InProcessFrontDoor"
)
# API key quotas are counted where every front end sees the same windows: Redis in distributed mode
# (proxy/serving/quota_counters.py).
LLAMASWAP_QUOTA_REDIS_URL = os.environ.get("REDIS_URL", "")
LLAMASWAP_QUOTA_COUNTER = (
    "proxy.serving.quota_counters.RedisQuotaCounter" if LLAMASWAP_QUOTA_REDIS_URL
    else "proxy.serving.quota_counters.InProcessQuotaCounter"
)

# The admin's login is throttled (django-axes): after AXES_FAILURE_LIMIT wrong passwords in a row for one user
# name from one address, that pair is refused (429, `scheduling.admin.login_lockout`) until AXES_COOLOFF_TIME has passed
# since its last try; a right password resets the count. The attempts are rows, so every front end sees them.
# `llamaswap axes_reset` (or axes_reset_username NAME) lifts the locks.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = int(os.environ.get("LLAMASWAP_LOGIN_FAILURE_LIMIT", "") or 5)
AXES_COOLOFF_TIME = timedelta(seconds=float(os.environ.get("LLAMASWAP_LOGIN_COOLOFF_SECONDS", "") or 900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "llamaswap_site.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "scheduling.admin.login_lockout.locked_out"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# LLAMASWAP_HTTPS=1: served behind a TLS-terminating reverse proxy that sets X-Forwarded-Proto
# (daphne here speaks plain HTTP). Only then is that header trusted: a client talking to daphne
# directly could otherwise claim HTTPS.
LLAMASWAP_HTTPS = os.environ.get("LLAMASWAP_HTTPS", "") == "1"
SESSION_COOKIE_SECURE = LLAMASWAP_HTTPS
CSRF_COOKIE_SECURE = LLAMASWAP_HTTPS
if LLAMASWAP_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # Prometheus scrapes over plain HTTP inside the network (/health is answered before any redirect).
    SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# llamaswap's own loggers all live under "llamaswap"; the config file's `logLevel` sets their level
# when `llamaswap serve` starts and on every reload (proxy/model_processes/log_level.py).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"}},
    "loggers": {
        "llamaswap": {"handlers": ["console"], "level": "INFO"},
        "django.request": {"handlers": ["console"], "level": "WARNING"},
    },
}
