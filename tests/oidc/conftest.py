"""A real OpenID provider (tests/oidc_provider) in a process of its own, and a person's
browser that walks the authorization-code flow over HTTP between it and Holdpoint's live
server.

The provider gets an RS256 key generated here, its own port and its own SQLite database in
a temporary folder. Its start waits on wall time with a generous budget (tests/waiting.py):
starting Python and migrating takes many seconds on a loaded machine. If it cannot start,
the test fails with the provider's log; it never skips.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from runs.oidc import BACKEND, forget_discovery
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "holdpoint-tests"
CLIENT_SECRET = secrets.token_urlsafe(32)
PASSWORD_BACKEND = "runs.ratelimit.LockoutModelBackend"
GROUP_MAP = {
    "hp-approvers": ["approver"],
    "hp-viewers": ["viewer"],
    "hp-operators": ["operator"],
    "finance": ["finance-approvers"],
}


def rsa_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@dataclass
class Provider:
    url: str
    folder: Path
    secret: str
    process: subprocess.Popen[bytes]

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def user(
        self,
        username: str,
        *,
        groups: list[str] | tuple[str, ...] = (),
        email: str | None = None,
        email_verified: bool = True,
        password: str = "idp-password",
    ) -> str:
        """Create or change a person at the provider; return their ``sub``."""
        answer = requests.post(
            f"{self.url}/_test/users",
            json={
                "username": username,
                "password": password,
                "email": f"{username}@example.com" if email is None else email,
                "email_verified": email_verified,
                "groups": list(groups),
                "first_name": username.capitalize(),
            },
            headers={"Authorization": f"Bearer {self.secret}"},
            timeout=60,
        )
        answer.raise_for_status()
        return str(answer.json()["sub"])

    def log(self) -> str:
        path = self.folder / "provider.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def start_provider(folder: Path, redirect_uris: str) -> Provider:
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(32)
    env = {
        **os.environ,
        "OIDC_PROVIDER_RSA_KEY": rsa_key(),
        "OIDC_PROVIDER_SECRET": secret,
        "OIDC_PROVIDER_CLIENT_ID": CLIENT_ID,
        "OIDC_PROVIDER_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PROVIDER_REDIRECT_URIS": redirect_uris,
    }
    for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    log = (folder / "provider.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(folder)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    provider = Provider(url="", folder=folder, secret=secret, process=process)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the test provider exited:\n{provider.log()}")
        port_file = folder / "port"
        if not port_file.exists():
            return False
        provider.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        try:
            answer = requests.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=10)
        except requests.RequestException:
            return False
        return answer.status_code == 200

    try:
        wait_for(ready, 90, "the test OpenID provider to start", interval=0.2)
    except AssertionError:
        stop_provider(provider)
        raise AssertionError(f"the test provider did not start:\n{provider.log()}") from None
    return provider


def stop_provider(provider: Provider) -> None:
    provider.process.terminate()
    try:
        provider.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        provider.process.kill()
        provider.process.wait(timeout=30)


def _callback_uris(live_server: Any) -> str:
    port = urlsplit(live_server.url).port
    return f"http://localhost:{port}/oidc/callback/ http://127.0.0.1:{port}/oidc/callback/"


@pytest.fixture(scope="module")
def provider(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    started = start_provider(tmp_path_factory.mktemp("idp"), _callback_uris(live_server))
    yield started
    stop_provider(started)


@pytest.fixture(scope="module")
def other_provider(
    live_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Provider]:
    """A second provider, with its own key and issuer: its tokens are not the first's."""
    started = start_provider(tmp_path_factory.mktemp("idp2"), _callback_uris(live_server))
    yield started
    stop_provider(started)


@pytest.fixture
def oidc(settings: Any, provider: Provider, transactional_db: None) -> Iterator[Provider]:
    """Holdpoint signed in through ``provider`` (passwords on as well, as by default)."""
    from runs.groups import ensure_default_groups

    ensure_default_groups()
    forget_discovery()
    settings.HOLDPOINT_OIDC_ISSUER = provider.issuer
    settings.HOLDPOINT_OIDC_CLIENT_ID = CLIENT_ID
    settings.HOLDPOINT_OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.HOLDPOINT_OIDC_SCOPES = "openid email profile groups"
    settings.HOLDPOINT_OIDC_NAME = "Acme SSO"
    settings.HOLDPOINT_OIDC_GROUP_MAP = GROUP_MAP
    settings.HOLDPOINT_OIDC_LINK_BY_EMAIL = False
    settings.AUTHENTICATION_BACKENDS = [PASSWORD_BACKEND, BACKEND]
    yield provider
    forget_discovery()


class Browser:
    """A person's browser: one cookie jar for both sites, redirects followed by hand so the
    test sees each hop (Holdpoint -> provider -> provider's login -> Holdpoint's callback)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.session = requests.Session()

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self.session.get(self._abs(url), allow_redirects=False, timeout=60, **kwargs)

    def post(self, url: str, data: dict[str, str], **kwargs: Any) -> requests.Response:
        return self.session.post(
            self._abs(url), data=data, allow_redirects=False, timeout=60, **kwargs
        )

    def _abs(self, url: str) -> str:
        return url if url.startswith("http") else self.base + url

    def follow(self, response: requests.Response, *, until: str | None = None) -> requests.Response:
        """Follow redirects; stop before a URL that starts with ``until``."""
        for _ in range(20):
            if response.status_code not in (301, 302, 303, 307, 308):
                return response
            location = requests.compat.urljoin(response.url, response.headers["Location"])
            if until and location.startswith(until):
                return response
            response = self.get(location)
        raise AssertionError("too many redirects")

    def csrf(self, cookie: str) -> str:
        return str(self.session.cookies.get(cookie))

    def password_sign_in_at_provider(
        self, login_page: requests.Response, username: str, password: str = "idp-password"
    ) -> requests.Response:
        assert login_page.status_code == 200, login_page.text[:500]
        next_url = parse_qs(urlsplit(login_page.url).query)["next"][0]
        return self.post(
            login_page.url,
            {
                "username": username,
                "password": password,
                "next": next_url,
                "csrfmiddlewaretoken": self.csrf("idp_csrftoken"),
            },
        )

    def to_callback(self, username: str, start: str = "/oidc/authenticate/") -> str:
        """Start a sign-in at Holdpoint and walk it to the provider's answer: the callback URL
        (with code and state) Holdpoint would be sent to, not yet visited."""
        response = self.follow(self.get(start), until=f"{self.base}/oidc/callback/")
        if response.status_code == 200 and "/accounts/login/" in response.url:
            response = self.password_sign_in_at_provider(response, username)
            response = self.follow(response, until=f"{self.base}/oidc/callback/")
        assert response.status_code == 302, (response.status_code, response.text[:500])
        location = requests.compat.urljoin(response.url, response.headers["Location"])
        assert location.startswith(f"{self.base}/oidc/callback/"), location
        return str(location)

    def sign_in(self, username: str, start: str = "/oidc/authenticate/") -> requests.Response:
        return self.follow(self.get(self.to_callback(username, start)))


@pytest.fixture
def browser_factory(live_server: Any) -> Any:
    def make() -> Browser:
        return Browser(live_server.url)

    return make
