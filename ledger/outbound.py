"""One guarded HTTP client for every outbound call to an agent- or input-chosen URL.

The webhook tool (its action, its look-up and its compensation, which the web process
runs when a person compensates) sends through ``send`` and nothing else. The guard:

- **Destination policy.** ``HOLDPOINT_WEBHOOK_ALLOW`` (host names, ``*.example.com``
  suffixes, addresses and CIDRs), when set, is the only place calls may go. Whatever it
  says, an address that is not public (private, loopback, link-local, shared, reserved,
  documentation ranges; IPv4 and IPv6, IPv4-mapped, 6to4 and NAT64 addresses judged by the
  IPv4 address inside) is refused unless a CIDR or address of the allow list names it or
  ``HOLDPOINT_OUTBOUND_ALLOW_LOCAL`` is on (the demo, the tests, the chaos harness).
  Unspecified and multicast addresses are always refused.
- **Resolve once.** The host name is resolved once per call, every address it resolves
  to is checked, and the connection goes to a checked address: a DNS answer that changes
  between the check and the connect (rebinding) cannot move the call elsewhere. The
  ``Host`` header and TLS server name stay the URL's host.
- **Headers.** Agents may not set ``Host``, ``Content-Length``, ``Expect`` or
  hop-by-hop headers, nor names that are not HTTP tokens or values with CR, LF or NUL.
- **Operator headers.** ``HOLDPOINT_WEBHOOK_HEADERS`` adds headers (credentials) to every
  call to a host, where the call does not set them: they live in the environment, never
  in the ledger, so compensations and look-ups can authenticate too.
- **Limits.** Each socket operation waits at most the tool's timeout, the whole call at
  most ``HOLDPOINT_OUTBOUND_TOTAL_SECONDS``; at most ``HOLDPOINT_OUTBOUND_MAX_REPLY_BYTES``
  of a reply body are read (and so stored); no redirects are followed, no proxy is used.

``check_request`` runs the same checks without any network I/O (no DNS): the ledger calls
it when a side effect begins, so that a refused destination is a ``422
destination_not_allowed`` before anything is written. ``send`` checks again with the
resolved addresses before it connects.

Secrets: ``redact_headers`` replaces the value of every secret-looking header (see
``is_secret_header``) with ``REDACTED``. The ledger stores requests and compensating
actions redacted; the tool sends the real value it was given in memory.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

from ledger.tools import ActionFailed, OutcomeUnknown

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

REDACTED = "[redacted]"
# Headers whose value is a credential, whatever the receiver calls it.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)
SECRET_WORDS = ("token", "secret", "key", "password", "passwd", "auth", "session", "signature")
# Set by the client itself (Host, framing) or meaningful only for one hop.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
FORBIDDEN_HEADERS = HOP_BY_HOP | {"host", "content-length", "expect"}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")
MAX_HEADERS = 50
MAX_HEADER_VALUE = 8192
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class DestinationNotAllowed(ActionFailed):
    """The destination policy refuses the URL: nothing was sent."""

    code = "destination_not_allowed"


class HeaderNotAllowed(ActionFailed):
    """A header an agent may not set, or one that is not valid HTTP: nothing was sent."""

    code = "invalid_input"


# --- Secrets -------------------------------------------------------------------------------


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_HEADERS or any(word in lowered for word in SECRET_WORDS)


def redact_headers(headers: Any) -> Any:
    """``headers`` with every secret value replaced by ``REDACTED`` (anything else as is)."""
    if not isinstance(headers, dict):
        return headers
    return {
        name: REDACTED if isinstance(name, str) and is_secret_header(name) else value
        for name, value in headers.items()
    }


def redact_request(value: Any) -> Any:
    """A request or compensating action as the ledger stores it: secret headers redacted."""
    if isinstance(value, dict) and isinstance(value.get("headers"), dict):
        return {**value, "headers": redact_headers(value["headers"])}
    return value


def without_redacted(headers: dict[str, str]) -> dict[str, str]:
    """Headers read back from the ledger, without the ones whose value was redacted: the
    placeholder is never sent as if it were the secret."""
    return {name: value for name, value in headers.items() if value != REDACTED}


# --- Policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    hosts: frozenset[str]
    suffixes: tuple[str, ...]
    networks: tuple[IPNetwork, ...]
    allow_local: bool

    @property
    def restricted(self) -> bool:
        return bool(self.hosts or self.suffixes or self.networks)

    def lists_host(self, host: str) -> bool:
        return host in self.hosts or any(host.endswith(s) for s in self.suffixes)

    def lists_address(self, address: IPAddress) -> bool:
        plain = plain_address(address)
        return any(address in net or plain in net for net in self.networks)


def parse_allow_entry(entry: str) -> tuple[str, str | IPNetwork]:
    """``("network", net)``, ``("suffix", ".example.com")`` or ``("host", name)``;
    ``ValueError`` for anything else (config/env.py turns it into ImproperlyConfigured)."""
    text = entry.strip().lower()
    if not text:
        raise ValueError("an empty entry")
    try:
        return "network", ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        pass
    if text.startswith("*."):
        text = text[1:]
        kind = "suffix"
    else:
        kind = "host"
    labels = text.strip(".").split(".")
    if not all(re.fullmatch(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?", label) for label in labels):
        raise ValueError(f"{entry!r} is not a host name, *.suffix, address or CIDR")
    return kind, text


@functools.lru_cache(maxsize=8)
def _policy(entries: tuple[str, ...], allow_local: bool) -> Policy:
    hosts: set[str] = set()
    suffixes: list[str] = []
    networks: list[IPNetwork] = []
    for entry in entries:
        kind, value = parse_allow_entry(entry)
        if kind == "network":
            networks.append(value)  # type: ignore[arg-type]
        elif kind == "suffix":
            suffixes.append(str(value))
        else:
            hosts.add(str(value))
    return Policy(frozenset(hosts), tuple(suffixes), tuple(networks), allow_local)


def current_policy() -> Policy:
    return _policy(
        tuple(getattr(settings, "HOLDPOINT_WEBHOOK_ALLOW", ()) or ()),
        bool(getattr(settings, "HOLDPOINT_OUTBOUND_ALLOW_LOCAL", False)),
    )


def plain_address(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def is_public(address: IPAddress) -> bool:
    plain = plain_address(address)
    return bool(plain.is_global) and not plain.is_multicast and not plain.is_reserved


def _refusal(address: IPAddress, policy: Policy, *, host_listed: bool) -> str | None:
    """Why ``address`` may not be called, or None."""
    plain = plain_address(address)
    if plain.is_unspecified or plain.is_multicast:
        return "an unspecified or multicast address"
    listed = policy.lists_address(address)
    if policy.restricted and not (host_listed or listed):
        return "not in HOLDPOINT_WEBHOOK_ALLOW"
    if not is_public(address) and not (listed or policy.allow_local):
        return "not a public address (private, loopback, link-local or reserved)"
    return None


# --- Checks without network I/O ------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent on the request line


def parse_url(url: Any) -> Destination:
    if not isinstance(url, str) or len(url) > 2048:
        raise ActionFailed("url must be an http:// or https:// URL of at most 2,048 characters.")
    if any(ch in url for ch in "\r\n\t\x00 ") or not url.isprintable():
        raise ActionFailed("url may not contain spaces or control characters.")
    parts: SplitResult = urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        raise ActionFailed("url must be an http:// or https:// URL.")
    if not parts.hostname:
        raise ActionFailed("url must name a host.")
    if parts.username is not None or parts.password is not None:
        raise ActionFailed(
            "url may not carry a user name or password; send credentials in a header."
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ActionFailed("url has a bad port.") from None
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return Destination(url, parts.scheme, parts.hostname.lower(), port, target)


def check_headers(headers: Any) -> dict[str, str]:
    """The agent's headers if the client may send them, else ``HeaderNotAllowed``."""
    if headers is None:
        return {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise HeaderNotAllowed("headers must map names to strings.")
    if len(headers) > MAX_HEADERS:
        raise HeaderNotAllowed(f"At most {MAX_HEADERS} headers.")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise HeaderNotAllowed(f"{name!r} is not a valid header name.", header=name[:100])
        if name.lower() in FORBIDDEN_HEADERS:
            raise HeaderNotAllowed(
                f"The {name} header is set by the HTTP client, not by agents.", header=name
            )
        if any(ch in value for ch in "\r\n\x00") or len(value) > MAX_HEADER_VALUE:
            raise HeaderNotAllowed(
                f"The value of {name} must be one line of at most {MAX_HEADER_VALUE:,} characters.",
                header=name,
            )
    return dict(headers)


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def check_destination(url: Any, *, addresses: Iterable[IPAddress] | None = None) -> Destination:
    """Refuse (``DestinationNotAllowed``) what the policy refuses.

    Without ``addresses`` no name is resolved: a literal address, a ``localhost`` name
    and the allow list are judged; ``send`` judges the resolved addresses too.
    """
    destination = parse_url(url)
    policy = current_policy()
    host = destination.host.rstrip(".")
    literal = _literal_address(host)
    host_listed = literal is None and policy.lists_host(host)
    if addresses is None:
        if literal is not None:
            addresses = [literal]
        elif host == "localhost" or host.endswith(".localhost"):
            addresses = [ipaddress.IPv4Address("127.0.0.1")]
        elif policy.restricted and not host_listed and not policy.networks:
            raise DestinationNotAllowed(
                f"{host} is not in HOLDPOINT_WEBHOOK_ALLOW.", url=url, host=host
            )
        else:
            addresses = []
    for address in addresses:
        reason = _refusal(address, policy, host_listed=host_listed)
        if reason is not None:
            raise DestinationNotAllowed(
                f"{host} ({address}) is {reason}; the destination policy refuses it.",
                url=url,
                host=host,
                address=str(address),
            )
    return destination


def check_request(url: Any, headers: Any) -> None:
    """Everything that can be checked before the call, without network I/O."""
    check_destination(url)
    check_headers(headers)


# --- Sending ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool


def resolve(destination: Destination) -> list[IPAddress]:
    literal = _literal_address(destination.host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(
            destination.host, destination.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise ActionFailed(
            f"Could not resolve {destination.host}: {exc}.", url=destination.url
        ) from exc
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise ActionFailed(f"{destination.host} has no address.", url=destination.url)
    return found


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the checked address; the Host header stays the URL's host."""

    def __init__(self, destination: Destination, address: IPAddress, timeout: float) -> None:
        super().__init__(destination.host, destination.port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((str(self._address), self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, destination: Destination, address: IPAddress, timeout: float) -> None:
        super().__init__(
            destination.host,
            destination.port,
            timeout=timeout,
            context=ssl.create_default_context(),
        )
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((str(self._address), self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The certificate is checked against the URL's host name, not the address.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _connect(
    destination: Destination, addresses: list[IPAddress], timeout: float
) -> http.client.HTTPConnection:
    """A connection to the first checked address that answers; nothing is sent yet, so
    every failure here is ``ActionFailed``."""
    factory = _PinnedHTTPSConnection if destination.scheme == "https" else _PinnedHTTPConnection
    last: Exception | None = None
    for address in addresses:
        conn = factory(destination, address, timeout)
        try:
            conn.connect()
            return conn
        except (OSError, ssl.SSLError) as exc:
            conn.close()
            last = exc
    raise ActionFailed(
        f"Could not connect to {destination.url}: {last}; nothing was sent.", url=destination.url
    )


def send(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    body: bytes | None,
    timeout: float,
    max_reply_bytes: int | None = None,
    total_seconds: float | None = None,
) -> Reply:
    """Send one request through the guard and read (a bounded part of) the reply.

    Raises ``DestinationNotAllowed`` or ``ActionFailed`` when nothing was sent, and
    ``OutcomeUnknown`` when the request may have reached the receiver but no complete
    status line came back.
    """
    limit = int(max_reply_bytes or settings.HOLDPOINT_OUTBOUND_MAX_REPLY_BYTES)
    total = float(total_seconds or settings.HOLDPOINT_OUTBOUND_TOTAL_SECONDS)
    destination = parse_url(url)
    headers = check_headers(headers)
    configured = (getattr(settings, "HOLDPOINT_WEBHOOK_HEADERS", None) or {}).get(
        destination.host.rstrip(".")
    )
    if configured:
        # The operator's credentials for this host, where the call does not bring its own.
        present = {name.lower() for name in headers}
        headers.update({k: v for k, v in configured.items() if k.lower() not in present})
    addresses = resolve(destination)
    check_destination(url, addresses=addresses)
    deadline = time.monotonic() + total
    conn = _connect(destination, addresses, min(timeout, total))
    # One clock for the whole exchange: a receiver that drips its answer a byte at a time
    # would otherwise keep every socket read just under the timeout.
    # The socket itself: http.client lets go of it once a "Connection: close" reply starts.
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, args=(conn.sock,))
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            conn.request(method, destination.target, body=body, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                raise OutcomeUnknown(
                    f"No answer from {url} in time; it may have acted.", url=url
                ) from exc
            raise OutcomeUnknown(f"The connection to {url} failed: {exc}.", url=url) from exc
        chunks: list[bytes] = []
        size = 0
        truncated = False
        try:
            while True:
                chunk = response.read(min(65536, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    truncated = True
                    break
        except (OSError, http.client.HTTPException):
            # The status is known; what was cut off is only the rest of the body.
            truncated = True
        if (response.length or 0) > 0 or time.monotonic() >= deadline:
            truncated = True  # Cut off by the clock (or the receiver) before its end.
        raw = b"".join(chunks)[:limit]
        return Reply(
            status=response.status,
            headers={k.lower(): v for k, v in response.getheaders()[:100]},
            body=raw,
            truncated=truncated,
        )
    finally:
        watchdog.cancel()
        conn.close()


def _cut(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
