"""Holdpoint settings: every value that varies between machines comes from the environment.

``DATABASE_URL`` selects PostgreSQL (production, CI); without it Holdpoint runs on
SQLite under ``var/`` in the zero-setup single-process mode. ``REDIS_URL``
selects the Redis channel layer; without it the in-memory layer is used, which
only reaches browsers connected to the same process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_destinations,
    env_float,
    env_group_channels,
    env_group_map,
    env_group_urls,
    env_host_headers,
    env_int,
    env_list,
    env_oidc_issuer,
    env_rate,
    env_str,
    parse_database_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("HOLDPOINT_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# PRODUCTION turns on the settings `manage.py check --deploy` asks for and refuses
# the development secret key and demo passwords.
PRODUCTION = env_bool("HOLDPOINT_PRODUCTION", False)

_DEV_SECRET = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdef"
SECRET_KEY = env_str("SECRET_KEY", "" if PRODUCTION else _DEV_SECRET)
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is required when HOLDPOINT_PRODUCTION is on; set it to 50+ random characters."
    )
if PRODUCTION and (SECRET_KEY == _DEV_SECRET or len(SECRET_KEY) < 50):
    raise ImproperlyConfigured(
        "SECRET_KEY must be at least 50 random characters in production "
        '(python -c "import secrets; print(secrets.token_urlsafe(64))").'
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "django_htmx",
    "template_partials",
    "runs",
    "ledger",
    "runtime",
    "api",
    "dashboard",
    "live",
    "config",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Under /api/: oversized or deeply nested bodies are refused before any other work.
    "api.problems.ApiBoundaryMiddleware",
    # Pages: a NUL character in the path, query or form is a 400 before any view (the API
    # answers its own problem in ApiBoundaryMiddleware).
    "config.middleware.NulCharacterMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # config.middleware.Pages*: Django's middleware of the same name, run for pages and for
    # API requests with a session cookie; a token API request skips it (docs/performance.md).
    "config.middleware.PagesSessionMiddleware",
    "config.middleware.PagesLocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.middleware.PagesAuthenticationMiddleware",
    # A session signed in through the company's identity provider is confirmed with it again
    # every HOLDPOINT_OIDC_REFRESH_SECONDS (nothing at all when sign-in through it is off).
    "config.middleware.OidcSessionRefreshMiddleware",
    "config.middleware.PagesMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.middleware.PagesCSPMiddleware",
    "config.middleware.PagesHtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "django.template.context_processors.tz",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
# Web processes: reuse connections through psycopg's pool instead of opening one per
# request (docs/performance.md). Each thread holds its connection until Django closes it
# at the end of a request, so leave it off (0) in worker processes, whose threads keep
# theirs for their lifetime.
DATABASE_POOL_SIZE = env_int("DATABASE_POOL_SIZE", 0, minimum=0)
if DATABASE_URL:
    DATABASES = {
        "default": parse_database_url(
            DATABASE_URL,
            pool_size=DATABASE_POOL_SIZE,
            pool_timeout=env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
        )
    }
    # DATABASE_URL through PgBouncer in transaction pooling (docs/operations.md, "More than
    # one machine"): a server connection is ours for one transaction only, so no
    # server-side cursors (a named cursor outlives its transaction in ``.iterator()``) and
    # no prepared statements (Django binds on the client already; psycopg must not
    # prepare either). The code keeps no other session state: no SET (Django's SET TIME
    # ZONE is replayed by PgBouncer, which tracks TimeZone), no session advisory locks,
    # no LISTEN on this connection (DATABASE_LISTEN_URL below).
    if env_bool("DATABASE_PGBOUNCER", False):
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None  # type: ignore[index]
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "holdpoint.sqlite3",
            # IMMEDIATE takes the write lock when a transaction starts, so two
            # transactions never both read and then fail to upgrade to a write
            # (SQLite's "database is locked" under concurrent writers).
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
            "TEST": {"NAME": str(VAR_DIR / "test-holdpoint.sqlite3")},
        }
    }
# Where LISTEN connects (runs/wakeups.py): PostgreSQL itself, when DATABASE_URL goes
# through PgBouncer in transaction pooling, which does not pass NOTIFY to a listener
# (a LISTEN lasts as long as the session, and the session is not ours). Empty: LISTEN on
# DATABASE_URL's database, as one machine runs it.
DATABASE_LISTEN_URL = env_str("DATABASE_LISTEN_URL")
DATABASE_LISTEN = parse_database_url(DATABASE_LISTEN_URL) if DATABASE_LISTEN_URL else None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer --------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(
            f"REDIS_URL={REDIS_URL!r} must start with redis://, rediss:// or unix://."
        )
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # channels_redis blocks in BRPOP for 5 s per read; redis-py 8 gives a socket
                # a 5 s read timeout by default, which killed idle sockets' consumers.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                "prefix": env_str("CHANNEL_PREFIX", "holdpoint"),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Cache: rate limits and the sign-in lockout -----------------------------------------------
# Every web process must see the same counters (runs/ratelimit.py): Redis when REDIS_URL is set,
# else PostgreSQL's table holdpoint_cache (created by migration runs 0006), else the process's
# memory, which is right only for the zero-setup single process (`manage.py serve`).
CACHES: dict[str, dict[str, Any]]
HOLDPOINT_CACHE = env_choice("HOLDPOINT_CACHE", "auto", ("auto", "redis", "database", "locmem"))
if HOLDPOINT_CACHE == "auto":
    HOLDPOINT_CACHE = "redis" if REDIS_URL else "database" if DATABASE_URL else "locmem"
if HOLDPOINT_CACHE == "redis":
    if not REDIS_URL:
        raise ImproperlyConfigured("HOLDPOINT_CACHE=redis needs REDIS_URL.")
    CACHES = {
        "default": {
            # Django's, with one client per pool and a one-round-trip counter (runs/cache.py).
            "BACKEND": "runs.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("CHANNEL_PREFIX", "holdpoint"),
        }
    }
elif HOLDPOINT_CACHE == "database":
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "holdpoint_cache",
            # Counters carry their own windows; the expiry only cleans up. Each write counts
            # the table and culls expired rows beyond MAX_ENTRIES, so keep it modest.
            "TIMEOUT": 86400,
            "OPTIONS": {"MAX_ENTRIES": 50_000},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "holdpoint",
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    }

# --- Auth, i18n, static ---------------------------------------------------------------------
# Django's ModelBackend behind the sign-in lockout (runs/ratelimit.py), for our login page and
# the admin's alike.
AUTHENTICATION_BACKENDS = ["runs.ratelimit.LockoutModelBackend"]
# N failed sign-ins within HOLDPOINT_LOGIN_LOCKOUT_SECONDS lock that account, or that address,
# for HOLDPOINT_LOGIN_LOCKOUT_SECONDS (0 turns a limit off). The address limit is higher: an
# office behind one address has many people who mistype.
HOLDPOINT_LOGIN_FAILURES_PER_ACCOUNT = env_int("HOLDPOINT_LOGIN_FAILURES_PER_ACCOUNT", 5, minimum=0)
HOLDPOINT_LOGIN_FAILURES_PER_ADDRESS = env_int(
    "HOLDPOINT_LOGIN_FAILURES_PER_ADDRESS", 30, minimum=0
)
HOLDPOINT_LOGIN_LOCKOUT_SECONDS = env_int("HOLDPOINT_LOGIN_LOCKOUT_SECONDS", 900, minimum=1)
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# --- Company sign-in (OpenID Connect; docs/security.md, "Company sign-in") -----------------------
# Off unless HOLDPOINT_OIDC_ISSUER is set: then the login page offers "Sign in with <name>"
# (runs/oidc.py, dashboard/views/oidc.py). The endpoints come from the issuer's discovery
# document unless the four endpoint settings name them.
HOLDPOINT_OIDC_ISSUER = env_oidc_issuer("HOLDPOINT_OIDC_ISSUER")
HOLDPOINT_OIDC_CLIENT_ID = env_str("HOLDPOINT_OIDC_CLIENT_ID").strip()
HOLDPOINT_OIDC_CLIENT_SECRET = env_str("HOLDPOINT_OIDC_CLIENT_SECRET")
HOLDPOINT_OIDC_SCOPES = env_str("HOLDPOINT_OIDC_SCOPES", "openid email profile").strip()
HOLDPOINT_OIDC_NAME = env_str("HOLDPOINT_OIDC_NAME", "your company account").strip()
HOLDPOINT_OIDC_SIGN_ALGO = env_choice(
    "HOLDPOINT_OIDC_SIGN_ALGO", "rs256", ("rs256", "rs384", "rs512", "es256", "es384", "es512")
).upper()
HOLDPOINT_OIDC_GROUPS_CLAIM = env_str("HOLDPOINT_OIDC_GROUPS_CLAIM", "groups").strip()
# Claim value -> Holdpoint group (a role of runs/groups.py or an approval policy's group):
# "hp-approvers=approver,hp-ops=operator", or a JSON object for values with , or =.
HOLDPOINT_OIDC_GROUP_MAP = env_group_map("HOLDPOINT_OIDC_GROUP_MAP")
# A first sign-in may take over the local account with the same e-mail only when this is on
# and the provider says the e-mail is verified (never a staff or superuser account).
HOLDPOINT_OIDC_LINK_BY_EMAIL = env_bool("HOLDPOINT_OIDC_LINK_BY_EMAIL", False)
# A session signed in through the provider is confirmed with it again after this many
# seconds (a removed group is gone then at the latest).
HOLDPOINT_OIDC_REFRESH_SECONDS = env_int("HOLDPOINT_OIDC_REFRESH_SECONDS", 900, minimum=30)
HOLDPOINT_OIDC_TIMEOUT = env_float("HOLDPOINT_OIDC_TIMEOUT", 10.0, minimum=0.5)
HOLDPOINT_OIDC_AUTHORIZATION_ENDPOINT = env_str("HOLDPOINT_OIDC_AUTHORIZATION_ENDPOINT").strip()
HOLDPOINT_OIDC_TOKEN_ENDPOINT = env_str("HOLDPOINT_OIDC_TOKEN_ENDPOINT").strip()
HOLDPOINT_OIDC_USERINFO_ENDPOINT = env_str("HOLDPOINT_OIDC_USERINFO_ENDPOINT").strip()
HOLDPOINT_OIDC_JWKS_URI = env_str("HOLDPOINT_OIDC_JWKS_URI").strip()
# 0: no password sign-in anywhere (the login page, the admin's): the provider only.
HOLDPOINT_PASSWORD_LOGIN = env_bool("HOLDPOINT_PASSWORD_LOGIN", True)
if HOLDPOINT_OIDC_ISSUER:
    if not HOLDPOINT_OIDC_CLIENT_ID or not HOLDPOINT_OIDC_CLIENT_SECRET:
        raise ImproperlyConfigured(
            "HOLDPOINT_OIDC_ISSUER needs HOLDPOINT_OIDC_CLIENT_ID and HOLDPOINT_OIDC_CLIENT_SECRET "
            "(the client registered for Holdpoint at the identity provider)."
        )
    if "openid" not in HOLDPOINT_OIDC_SCOPES.split():
        raise ImproperlyConfigured(
            f"HOLDPOINT_OIDC_SCOPES={HOLDPOINT_OIDC_SCOPES!r} must include openid."
        )
    AUTHENTICATION_BACKENDS = [
        *(AUTHENTICATION_BACKENDS if HOLDPOINT_PASSWORD_LOGIN else []),
        "runs.oidc.OidcBackend",
    ]
elif not HOLDPOINT_PASSWORD_LOGIN:
    raise ImproperlyConfigured(
        "HOLDPOINT_PASSWORD_LOGIN=0 needs HOLDPOINT_OIDC_ISSUER: nobody could sign in."
    )
# mozilla-django-oidc's own settings that Holdpoint does not vary (runs/oidc.py maps its
# names for the settings above to ours, and reads the endpoints lazily).
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
OIDC_MAX_STATES = 10
OIDC_STORE_ACCESS_TOKEN = False
OIDC_STORE_ID_TOKEN = False

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Outside production WhiteNoise serves straight from the app folders, no collectstatic needed.
WHITENOISE_USE_FINDERS = not PRODUCTION
STATICFILES_DIRS = [BASE_DIR / "static"]

# --- Security -------------------------------------------------------------------------------
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
SESSION_COOKIE_HTTPONLY = True
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# Content Security Policy (django-csp): scripts and styles only from our own static files, so an
# agent's text that slipped past escaping still could not run. No inline scripts or styles
# anywhere, hence no 'unsafe-inline' and no nonces; 'self' covers the same-origin live socket.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: DRF answers 401 with the first class's WWW-Authenticate challenge
    # (a session has none, which would turn "not logged in" into a 403).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.ThrottledTokenAuthentication",
        "api.authentication.CsrfSessionAuthentication",
        "api.authentication.AnonymousRateAuthentication",
    ],
    # One throttle for every endpoint, scoped by principal (api/throttles.py).
    "DEFAULT_THROTTLE_CLASSES": ["api.throttles.PrincipalRateThrottle"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # Every error is application/problem+json with a stable code (api/problems.py).
    "EXCEPTION_HANDLER": "api.problems.exception_handler",
}
# API rates (N/s, N/min, N/15min, N/hour, N/day, or off), per worker token, per person, per
# address without credentials; failed tokens per address. The defaults stop runaway scripts
# and token guessing and are far above what people, `make run`, the benchmarks and the chaos
# harness send (many workers share one token and heartbeat: docs/security.md).
HOLDPOINT_THROTTLE_WORKER = env_rate("HOLDPOINT_THROTTLE_WORKER", "60000/min")
# How long a web process trusts a worker token it looked up (one query per call saved):
# a token revoked in another process is refused there within this many seconds; the
# process that revokes forgets at once (runs/tokens.py). 0: look up every call.
HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS = env_float(
    "HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS", 5.0, minimum=0
)
HOLDPOINT_THROTTLE_USER = env_rate("HOLDPOINT_THROTTLE_USER", "12000/min")
HOLDPOINT_THROTTLE_ANON = env_rate("HOLDPOINT_THROTTLE_ANON", "600/min")
HOLDPOINT_THROTTLE_AUTH_FAILURES = env_rate("HOLDPOINT_THROTTLE_AUTH_FAILURES", "30/min")
# Long-polling claims waiting at once in one web process, per worker token and per client
# address (0: no cap). Each holds a thread and claims again every second; past the cap a
# claim is answered 429 with Retry-After at once (api/worker_protocol.py).
HOLDPOINT_WAITING_CLAIMS_PER_TOKEN = env_int("HOLDPOINT_WAITING_CLAIMS_PER_TOKEN", 64, minimum=0)
HOLDPOINT_WAITING_CLAIMS_PER_ADDRESS = env_int(
    "HOLDPOINT_WAITING_CLAIMS_PER_ADDRESS", 128, minimum=0
)
SPECTACULAR_SETTINGS = {
    "TITLE": "Holdpoint API",
    "DESCRIPTION": "Control and worker API of Holdpoint.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # AnonymousRateAuthentication only counts requests; it is no way to sign in.
    "AUTHENTICATION_WHITELIST": [
        "api.authentication.ThrottledTokenAuthentication",
        "api.authentication.CsrfSessionAuthentication",
        "api.authentication.WorkerTokenAuthentication",
    ],
    # One name for the tool rules' choice set, whichever field uses it (api/tool_rules.py).
    "ENUM_NAME_OVERRIDES": {"ToolRuleKindEnum": "ledger.models.ToolRuleKind"},
}

# --- Holdpoint ------------------------------------------------------------------------------
# How long a worker may hold an attempt without renewing it, and how often it renews.
HOLDPOINT_LEASE_SECONDS = env_float("HOLDPOINT_LEASE_SECONDS", 60.0, minimum=1.0)
# The other clock: how long a person has to answer, when the agent names no expiry.
HOLDPOINT_INPUT_EXPIRES_SECONDS = env_int("HOLDPOINT_INPUT_EXPIRES_SECONDS", 86400, minimum=1)
# A lost lease starts a new attempt automatically at most this many times in a row.
HOLDPOINT_MAX_LEASE_LOSSES = env_int("HOLDPOINT_MAX_LEASE_LOSSES", 3, minimum=1)
# Events and checkpoints of runs finished longer ago than this are purged by the sweep
# (0 keeps them forever). Live runs are never touched.
HOLDPOINT_HISTORY_RETENTION_DAYS = env_int("HOLDPOINT_HISTORY_RETENTION_DAYS", 90, minimum=0)
HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS = env_int(
    "HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS", 86400, minimum=60
)
# How long a request holding an Idempotency-Key may take before a retry with the same key
# may take it over (its process is then presumed dead); see runs/idempotency.py.
HOLDPOINT_IDEMPOTENCY_IN_PROGRESS_SECONDS = env_int(
    "HOLDPOINT_IDEMPOTENCY_IN_PROGRESS_SECONDS", 60, minimum=1
)
# Requests per user per minute to the pause endpoints (run pause, agent pause/unpause).
HOLDPOINT_PAUSE_THROTTLE_PER_MINUTE = env_int("HOLDPOINT_PAUSE_THROTTLE_PER_MINUTE", 120, minimum=1)
# Rows of one CSV download of the audit trail (GET /api/audit?format=csv); past it the
# response's Link header continues from where it stopped (api/audit.py).
HOLDPOINT_AUDIT_CSV_MAX_ROWS = env_int("HOLDPOINT_AUDIT_CSV_MAX_ROWS", 100_000, minimum=1)
HOLDPOINT_MAX_BODY_BYTES = env_int("HOLDPOINT_MAX_BODY_BYTES", 256 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = HOLDPOINT_MAX_BODY_BYTES
# The most threads one web process serves requests in at once (config/handler.py); each
# waiting long poll (a remote worker's claim or watch) holds one.
HOLDPOINT_WEB_THREADS = env_int("HOLDPOINT_WEB_THREADS", 1000, minimum=8)
# Admission control per web process (api/admission.py): past this many requests being
# served (long polls apart, in their own budget) a request is answered 503 `overloaded`
# with Retry-After at once, before it takes a thread or a database connection. 0: no limit.
HOLDPOINT_WEB_MAX_INFLIGHT = env_int("HOLDPOINT_WEB_MAX_INFLIGHT", 64, minimum=0)
HOLDPOINT_WEB_MAX_LONG_POLLS = env_int("HOLDPOINT_WEB_MAX_LONG_POLLS", 512, minimum=0)
# The Retry-After (seconds) of a 503 `overloaded`, from the limits above or a request that
# waited DATABASE_POOL_TIMEOUT for a pooled database connection in vain.
HOLDPOINT_OVERLOAD_RETRY_AFTER = env_int("HOLDPOINT_OVERLOAD_RETRY_AFTER", 1, minimum=1)
HOLDPOINT_AGENT_MODULES = env_list("HOLDPOINT_AGENT_MODULES", ["runtime.demo_agents"])
HOLDPOINT_CONFIG_STORE_DIR = Path(
    env_str("HOLDPOINT_CONFIG_STORE_DIR", str(VAR_DIR / "config-store"))
)
# Side-effect ledger: how long an unsettled effect is left to its worker before it counts as
# stale (a person may reconcile it, the reconciler looks its key up); webhook tool settings.
HOLDPOINT_LEDGER_SETTLE_SECONDS = env_int("HOLDPOINT_LEDGER_SETTLE_SECONDS", 300, minimum=1)
HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS = env_float(
    "HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1
)
# Where outbound calls (the webhook tool, its look-ups and compensations) may go
# (ledger/outbound.py): when set, only these host names, *.suffixes, addresses and CIDRs.
HOLDPOINT_WEBHOOK_ALLOW = env_destinations("HOLDPOINT_WEBHOOK_ALLOW")
# Private, loopback and link-local destinations are refused unless the allow list names
# them or this is on: for the demo receiver, the tests and the chaos harness only.
HOLDPOINT_OUTBOUND_ALLOW_LOCAL = env_bool("HOLDPOINT_OUTBOUND_ALLOW_LOCAL", False)
# Headers the outbound client adds to every call to a host (JSON: {"host": {"Name": "v"}}),
# for credentials that agents should not hold or that the ledger never stores: a
# compensation run by the web process and the look-ups use them too.
HOLDPOINT_WEBHOOK_HEADERS = env_host_headers("HOLDPOINT_WEBHOOK_HEADERS")
# The most of a reply body that is read (and stored), and the longest one call may take.
HOLDPOINT_OUTBOUND_MAX_REPLY_BYTES = env_int(
    "HOLDPOINT_OUTBOUND_MAX_REPLY_BYTES", 64 * 1024, minimum=1024
)
HOLDPOINT_OUTBOUND_TOTAL_SECONDS = env_float("HOLDPOINT_OUTBOUND_TOTAL_SECONDS", 30.0, minimum=1.0)
HOLDPOINT_WEBHOOK_LOOKUP_URL = env_str("HOLDPOINT_WEBHOOK_LOOKUP_URL")
if HOLDPOINT_WEBHOOK_LOOKUP_URL and "{idempotency_key}" not in HOLDPOINT_WEBHOOK_LOOKUP_URL:
    raise ImproperlyConfigured(
        "HOLDPOINT_WEBHOOK_LOOKUP_URL must contain {idempotency_key}, "
        "e.g. https://hooks.example.com/deliveries/{idempotency_key}."
    )

# Notifications (docs/notifications.md): the address links in messages start with (unset:
# the address `manage.py serve` serves, ledger/notifications.py `public_url`); the
# webhook of each group (group=url, comma-separated; Slack-compatible JSON); the share of
# a request's time left when its reminder goes (0: no reminders); the least time between
# two messages to one person (later ones are folded into a digest).
HOLDPOINT_PUBLIC_URL = env_str("HOLDPOINT_PUBLIC_URL").strip().rstrip("/")
if HOLDPOINT_PUBLIC_URL and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", HOLDPOINT_PUBLIC_URL):
    raise ImproperlyConfigured(
        "HOLDPOINT_PUBLIC_URL must be the dashboard's address as people reach it, "
        "e.g. https://holdpoint.example.com."
    )
HOLDPOINT_NOTIFY_WEBHOOKS = env_group_urls("HOLDPOINT_NOTIFY_WEBHOOKS")
HOLDPOINT_NOTIFY_REMIND_SHARE = env_float("HOLDPOINT_NOTIFY_REMIND_SHARE", 0.25, minimum=0.0)
if HOLDPOINT_NOTIFY_REMIND_SHARE >= 1:
    raise ImproperlyConfigured("HOLDPOINT_NOTIFY_REMIND_SHARE must be below 1 (e.g. 0.25).")
HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = env_int(
    "HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS", 60, minimum=0
)

# Slack (docs/notifications.md, Slack): the app's bot token and signing secret, the Web
# API's address (a local stand-in for the demo and the tests), the channel each group's
# approvals and questions are posted to (group=channel id), and whether a Slack user whose
# verified e-mail matches exactly one person is linked to them without asking.
HOLDPOINT_SLACK_BOT_TOKEN = env_str("HOLDPOINT_SLACK_BOT_TOKEN")
HOLDPOINT_SLACK_SIGNING_SECRET = env_str("HOLDPOINT_SLACK_SIGNING_SECRET")
HOLDPOINT_SLACK_API_URL = env_str("HOLDPOINT_SLACK_API_URL", "https://slack.com/api/")
if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", HOLDPOINT_SLACK_API_URL):
    raise ImproperlyConfigured("HOLDPOINT_SLACK_API_URL must be an http(s) URL.")
HOLDPOINT_SLACK_API_URL = HOLDPOINT_SLACK_API_URL.rstrip("/") + "/"
HOLDPOINT_SLACK_CHANNELS = env_group_channels("HOLDPOINT_SLACK_CHANNELS")
HOLDPOINT_SLACK_LINK_BY_EMAIL = env_bool("HOLDPOINT_SLACK_LINK_BY_EMAIL", False)
if HOLDPOINT_SLACK_CHANNELS and not (HOLDPOINT_SLACK_BOT_TOKEN and HOLDPOINT_SLACK_SIGNING_SECRET):
    raise ImproperlyConfigured(
        "HOLDPOINT_SLACK_CHANNELS needs HOLDPOINT_SLACK_BOT_TOKEN and "
        "HOLDPOINT_SLACK_SIGNING_SECRET (the Slack app's Basic Information page)."
    )

# The demo accounts' password at first start of `manage.py serve` (generated when unset).
HOLDPOINT_DEMO_PASSWORD = env_str("HOLDPOINT_DEMO_PASSWORD")

LOG_FORMAT = env_choice("LOG_FORMAT", "text", ("text", "json"))
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "runs.logcontext.ContextFilter"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
# When set, /metrics requires "Authorization: Bearer <token>".
HOLDPOINT_METRICS_TOKEN = env_str("HOLDPOINT_METRICS_TOKEN")
# Without a token, /metrics answers anyone only when this is on: by default outside
# production, never by default in production (`check --deploy` warns either way).
HOLDPOINT_METRICS_PUBLIC = env_bool("HOLDPOINT_METRICS_PUBLIC", not PRODUCTION)

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "holdpoint@localhost")
# For EMAIL_BACKEND=django.core.mail.backends.filebased.EmailBackend: one file per connection.
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
# SMTP, for EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend in production.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 30, minimum=1)
