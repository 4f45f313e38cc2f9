"""Who may read /metrics (``vllm-autotuner run --metrics-auth``), and the HTTPS that carries their tokens.

The operator's metrics name every tuned Deployment, its SLO and its traffic: with the flag only a caller the
apiserver authenticates (a TokenReview of its bearer token) and authorizes (a SubjectAccessReview: ``get`` on the
non-resource URL ``/metrics``) reads them, as controller-runtime's metrics server and kube-rbac-proxy do, so that
a scraper is let in by an RBAC binding and nothing else. Verdicts are cached briefly, a scraper then costs the
apiserver two reviews a minute, not two a scrape: an allow for ``ALLOWED_TTL``, a refusal for the shorter
``DENIED_TTL`` (a binding just made takes effect soon), by a hash of the token, so that the cache holds none. An
apiserver that does not answer gives 503 and is never cached: no answer lets nobody in.

Whoever reaches the port can send tokens: the reviews run in threads of their own (``REVIEWERS``), never in the
default pool the Lease renewal and the reconciler's calls use, so that a flood of made-up tokens cannot cost the
leader its Lease; at most ``IN_FLIGHT`` tokens are under review at once (a request beyond gets 503 at once), and
requests with a token already under review wait for that review.

Tokens must not travel in clear, so the flag also serves HTTPS: with the given certificate (cert-manager's Secret),
else one made at start, self-signed, as controller-runtime does. A given certificate is loaded again when its files
change (``CertificateWatch``), as controller-runtime's certwatcher does: cert-manager renews it, and the kubelet
updates the Secret's volume, long before the old one expires.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import os
import ssl
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from vllm_autotuner.controller.kube import Kube, api_error

log = logging.getLogger(__name__)

ALLOWED_TTL = 60.0
DENIED_TTL = 10.0
#: Tokens whose verdicts are kept: a few scrapers in practice; bounded, so that callers with made-up tokens cannot
#: grow it without end (the least recently used goes first).
CACHE_SIZE = 1024
#: Threads of the reviews, apart from the default pool; and tokens under review at once, beyond which a caller is
#: answered 503 without one: a scraper or two need one each.
REVIEWERS = 2
IN_FLIGHT = 16


@dataclass(frozen=True)
class Verdict:
    """An HTTP status for the caller (200, 401, 403, 503) and what to tell it when it is not let in."""

    status: int
    reason: str = ""


ALLOWED = Verdict(200)
NO_TOKEN = Verdict(401, "a bearer token is needed: Authorization: Bearer <token>")
BUSY = Verdict(503, f"{IN_FLIGHT} tokens are under review already; retry")
#: What a caller is told when the apiserver was not asked: the details (the operator's identity, the apiserver's
#: address) go to the log, not to whoever sent a token.
UNREVIEWED = Verdict(503, "the apiserver could not be asked whether this token may read /metrics")


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme is case-insensitive, RFC 7235), or
    None when there is none."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class VerdictCache:
    """Verdicts by the SHA-256 of their token, each until its TTL passes; at most ``size``, the least recently used
    dropped first."""

    def __init__(self, allowed_ttl: float = ALLOWED_TTL, denied_ttl: float = DENIED_TTL, size: int = CACHE_SIZE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed_ttl, self.denied_ttl, self.size, self.clock = allowed_ttl, denied_ttl, size, clock
        self._entries: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()

    def get(self, key: bytes) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self.clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: bytes, verdict: Verdict) -> None:
        ttl = self.allowed_ttl if verdict.status == 200 else self.denied_ttl
        if ttl <= 0:
            return
        self._entries[key] = (self.clock() + ttl, verdict)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


class MetricsAuth:
    """The verdict on a request's Authorization header: the apiserver's, through the cache."""

    def __init__(self, kube: Kube, cache: VerdictCache | None = None) -> None:
        self.kube = kube
        self.cache = cache or VerdictCache()
        self._reviewers = ThreadPoolExecutor(REVIEWERS, thread_name_prefix="metrics-auth")
        self._pending: dict[bytes, asyncio.Task[Verdict]] = {}  # by token hash: the reviews under way

    async def verdict(self, authorization: str | None) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).digest()  # the cache and the reviews under way hold no token
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        review = self._pending.get(key)
        if review is None:
            if len(self._pending) >= IN_FLIGHT:
                return BUSY
            review = self._pending[key] = asyncio.create_task(self._reviewed(key, token))
            review.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(review)  # a caller gone does not cancel the review others wait for

    async def _reviewed(self, key: bytes, token: str) -> Verdict:
        try:
            verdict = await asyncio.get_running_loop().run_in_executor(self._reviewers, self._review, token)
        except (ApiException, HTTPError) as exc:  # refused (no grant to review), a 5xx, a timeout: not known
            log.warning("a /metrics caller was refused: the apiserver did not review its token (%s)", api_error(exc))
            return UNREVIEWED
        self.cache.put(key, verdict)
        return verdict

    def close(self) -> None:
        """Stop the review threads, once the server stopped (``HttpEndpoints.stop``): no request waits for a review
        then; one under way ends with its call's timeout, and none starts after."""
        self._reviewers.shutdown(wait=False, cancel_futures=True)

    def _review(self, token: str) -> Verdict:
        status = self.kube.review_token(token)
        if not status.get("authenticated"):
            return Verdict(401, "the apiserver does not authenticate this token")
        user = status.get("user") or {}
        if not self.kube.may_get_metrics(user):
            return Verdict(403, f"{user.get('username')} may not get /metrics: bind it to a ClusterRole with "
                                f"nonResourceURLs [/metrics], verbs [get]")
        return ALLOWED


#: How often a given certificate's files are looked at (``CertificateWatch``).
CERT_CHECK_SECONDS = 30.0


class CertificateWatch:
    """The given certificate and key, loaded anew when either file changes (looked at every ``interval`` seconds):
    each new connection is handed the newest pair loaded (``context``'s SNI callback, called for every client
    hello, a name sent or not), as a fresh context, since loading into a live one keeps a pair of another key type
    beside it (an RSA certificate renewed as ECDSA would still be served to clients that prefer RSA). A pair that
    cannot be loaded (the kubelet between its two files, a key that is not the certificate's) is said once, the
    one before served, and tried again at each look."""

    def __init__(self, cert_file: str, key_file: str, interval: float = CERT_CHECK_SECONDS) -> None:
        self.files, self.interval = (cert_file, key_file), interval
        # stamped before the load: files swapped meanwhile are seen at the next look
        self._seen: object = self._stamp()
        self._failed: object = self._seen
        self.context = self._current = tls_context(cert_file, key_file)
        self.context.sni_callback = self._hand_out

    def _hand_out(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        connection.context = self._current

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        # a Secret's volume swaps a symlink: stat follows it to a new file
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in map(os.stat, self.files))

    def reload_if_changed(self) -> bool:
        """Whether the files changed and were loaded."""
        stamp: object = None  # files that cannot be read
        try:
            stamp = self._stamp()
            if stamp == self._seen:
                return False
            fresh = tls_context(*self.files)
        except OSError as exc:  # ssl.SSLError too
            if stamp != self._failed:
                log.warning("the HTTPS certificate of /metrics (%s, %s) changed but could not be loaded (%s): the one "
                            "loaded before is served, and it is tried again every %gs", *self.files, exc,
                            self.interval)
                self._failed = stamp
            return False
        self._seen, self._failed, self._current = stamp, stamp, fresh  # a later failure is said again
        log.info("the HTTPS certificate of /metrics was loaded again from %s", self.files[0])
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.reload_if_changed()
            except Exception:  # a bug: said, and the watch goes on rather than leave a renewal unserved unsaid
                log.exception("looking at the HTTPS certificate of /metrics failed; tried again in %gs",
                              self.interval)


def tls_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """The HTTPS server's context: the given certificate and key, else a self-signed pair made now (the key never
    leaves this process but for a private temporary directory, gone once loaded: ``ssl`` loads only from files)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file and key_file:
        context.load_cert_chain(cert_file, key_file)
        return context
    cert, key = self_signed_certificate()
    with tempfile.TemporaryDirectory() as scratch:  # mode 0700
        (Path(scratch) / "tls.crt").write_bytes(cert)
        (Path(scratch) / "tls.key").write_bytes(key)
        context.load_cert_chain(Path(scratch) / "tls.crt", Path(scratch) / "tls.key")
    return context


def self_signed_certificate(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None) -> tuple[bytes, bytes]:
    """A PEM certificate for ``localhost``, valid for a year, and its PEM key (``key``, else a new ECDSA P-256 one):
    for the transport only, as no client can verify it (the pod makes a new one at each start). Signed with SHA-256,
    hence an ECDSA or RSA key only (Ed25519 and Ed448 sign with no hash)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vllm-autotuner")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
