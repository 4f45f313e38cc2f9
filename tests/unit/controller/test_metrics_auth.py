"""``--metrics-auth``'s pure parts: the bearer token of a header, the verdict cache (by a hash of the token,
bounded, each verdict for its TTL), no verdict cached when the apiserver did not answer, and the flags it takes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
import threading
import urllib.error
import urllib.request

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import client

from vllm_autotuner.cli import main
from vllm_autotuner.controller.kube import Kube
from vllm_autotuner.controller.metrics import OperatorMetrics
from vllm_autotuner.controller.metricsauth import (
    ALLOWED,
    BUSY,
    IN_FLIGHT,
    CertificateWatch,
    NO_TOKEN,
    MetricsAuth,
    Verdict,
    VerdictCache,
    bearer_token,
    self_signed_certificate,
    tls_context,
)
from vllm_autotuner.controller.operator import HttpEndpoints
from vllm_autotuner.sim import localenv

DENIED = Verdict(403, "no")


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc.def", "abc.def"), ("bearer abc", "abc"), ("  BEARER   abc  ", "abc"),
    (None, None), ("", None), ("Bearer", None), ("Bearer   ", None), ("Basic dXNlcjpwYXNz", None), ("abc", None),
])
def test_the_bearer_token_of_an_authorization_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_verdict_is_kept_for_its_ttl_by_a_hash_of_the_token() -> None:
    clock = Clock()
    cache = VerdictCache(allowed_ttl=60, denied_ttl=10, clock=clock)
    cache.put(b"allowed", ALLOWED)
    cache.put(b"denied", DENIED)
    assert (cache.get(b"allowed"), cache.get(b"denied"), cache.get(b"other")) == (ALLOWED, DENIED, None)
    clock.now += 10
    assert (cache.get(b"allowed"), cache.get(b"denied")) == (ALLOWED, None)
    clock.now += 50
    assert cache.get(b"allowed") is None and not cache._entries


def test_the_cache_keeps_the_most_recently_used_verdicts_up_to_its_size() -> None:
    cache = VerdictCache(size=2, clock=Clock())
    cache.put(b"a", ALLOWED)
    cache.put(b"b", ALLOWED)
    assert cache.get(b"a") == ALLOWED  # now more recent than b
    cache.put(b"c", DENIED)
    assert (cache.get(b"a"), cache.get(b"b"), cache.get(b"c")) == (ALLOWED, None, DENIED)


class FakeKube:
    """The apiserver's reviews: ``user`` authenticated, ``allowed`` its answer; ``failure`` raised instead."""

    def __init__(self, allowed: bool, failure: Exception | None = None, answer: threading.Event | None = None) -> None:
        self.allowed, self.failure, self.reviews = allowed, failure, 0
        self.answer = answer  # set: the apiserver answers (else at once)
        self.threads: set[str] = set()

    def review_token(self, token: str) -> dict:
        self.reviews += 1
        self.threads.add(threading.current_thread().name)
        if self.answer is not None:
            self.answer.wait(10)
        if self.failure:
            raise self.failure
        return {"authenticated": token == "good", "user": {"username": "system:serviceaccount:mon:prometheus"}}

    def may_get_metrics(self, user: dict) -> bool:
        return self.allowed


@pytest.mark.parametrize(("allowed", "token", "status"), [(True, "good", 200), (False, "good", 403),
                                                         (True, "bad", 401)])
def test_each_verdict_is_asked_once_then_cached(allowed: bool, token: str, status: int) -> None:
    kube = FakeKube(allowed)
    auth = MetricsAuth(kube)  # type: ignore[arg-type]
    verdicts = [asyncio.run(auth.verdict(f"Bearer {token}")) for _ in range(2)]
    assert [v.status for v in verdicts] == [status, status] and kube.reviews == 1
    assert asyncio.run(auth.verdict(None)) == NO_TOKEN and kube.reviews == 1
    assert set(auth.cache._entries) == {hashlib.sha256(token.encode()).digest()}  # the cache holds no token


def test_a_flood_of_tokens_is_reviewed_apart_from_the_default_pool_a_few_at_a_time() -> None:
    """Made-up tokens from whoever reaches the port: reviewed in threads of their own (the Lease renewal's pool
    stays free), at most IN_FLIGHT at once (the rest answered 503 at once); a token already under review waits
    for that review."""
    answer = threading.Event()
    kube = FakeKube(True, answer=answer)
    auth = MetricsAuth(kube)  # type: ignore[arg-type]

    async def flood() -> list[Verdict]:
        asking = [asyncio.create_task(auth.verdict(f"Bearer made-up-{n}")) for n in range(IN_FLIGHT)]
        asking += [asyncio.create_task(auth.verdict("Bearer made-up-0"))]  # the same token again
        for _ in range(1000):  # let each ask, a turn of the loop each (no clock)
            if len(auth._pending) == IN_FLIGHT:
                break
            await asyncio.sleep(0)
        beyond = await auth.verdict("Bearer one-more")
        answer.set()
        return [beyond, *await asyncio.gather(*asking)]

    verdicts = asyncio.run(flood())
    auth.close()
    assert verdicts[0] == BUSY and {v.status for v in verdicts[1:]} == {401}
    assert kube.reviews == IN_FLIGHT and kube.threads and all(t.startswith("metrics-auth") for t in kube.threads)


def test_an_apiserver_that_does_not_answer_lets_nobody_in_and_nothing_is_cached() -> None:
    """503, said; asked again at the next request."""
    port = localenv.free_port()  # nothing listens there
    unreachable = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    auth = MetricsAuth(Kube(unreachable, OperatorMetrics()))
    for _ in range(2):
        verdict = asyncio.run(auth.verdict("Bearer good"))
        assert verdict.status == 503 and "the apiserver could not be asked" in verdict.reason
    assert not auth.cache._entries


def test_the_endpoints_answer_with_the_verdict_over_https() -> None:
    port = localenv.free_port()
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE

    def get(path: str, token: str | None = None) -> tuple[int, str, str | None]:
        request = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=unverified) as response:
                return response.status, response.read().decode(), None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.headers.get("WWW-Authenticate")

    async def scenario(allowed: bool) -> list[tuple[int, str, str | None]]:
        http = HttpEndpoints(OperatorMetrics(), "127.0.0.1", port, MetricsAuth(FakeKube(allowed)),  # type: ignore
                             tls_context(None, None))
        await http.start()
        try:
            return [await asyncio.to_thread(get, *request)
                    for request in (("/healthz",), ("/metrics",), ("/metrics", "bad"), ("/metrics", "good"))]
        finally:
            await http.stop()

    healthz, none, bad, good = asyncio.run(scenario(True))
    assert healthz == (200, "ok", None)
    assert none[0] == 401 and none[2] == "Bearer" and bad[0] == 401
    assert good[0] == 200 and "vllm_autotuner_leader" in good[1]
    assert asyncio.run(scenario(False))[3][:2] == (403, "system:serviceaccount:mon:prometheus may not get /metrics: "
                                                        "bind it to a ClusterRole with nonResourceURLs [/metrics], "
                                                        "verbs [get]\n")


def test_a_renewed_certificate_is_served_once_its_files_change_and_a_broken_pair_keeps_the_one_before(
        tmp_path, caplog) -> None:
    """cert-manager renews the Secret (here from RSA to ECDSA) and the kubelet swaps the volume's files: the
    running server hands new connections the new certificate, whatever key types the client prefers, without a
    restart; a pair caught half written is said once, the one before served, and tried again."""
    port = localenv.free_port()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"

    def write(pair: tuple[bytes, bytes]) -> None:
        for path, content in zip((cert, key), pair, strict=True):  # a new file in place, as the kubelet swaps
            (tmp_path / "new").write_bytes(content)
            os.replace(tmp_path / "new", path)

    def served(ciphers: str | None = None) -> bytes | None:
        """The certificate a client gets (to 127.0.0.1: no server name sent), with only ``ciphers`` if given; None
        when no certificate the server has fits them."""
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        if ciphers:
            context.set_ciphers(ciphers)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            try:
                with context.wrap_socket(raw) as tls:
                    return tls.getpeercert(binary_form=True)
            except ssl.SSLError:
                return None

    first = self_signed_certificate(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    renewed = self_signed_certificate()
    der = [ssl.PEM_cert_to_DER_cert(pem.decode()) for pem, _ in (first, renewed)]
    write(first)
    watch = CertificateWatch(str(cert), str(key), interval=0.05)

    async def scenario() -> list[bytes | None]:
        http = HttpEndpoints(OperatorMetrics(), "127.0.0.1", port, MetricsAuth(FakeKube(True)),  # type: ignore
                             watch)
        await http.start()
        try:
            before = await asyncio.to_thread(served)
            write(renewed)
            deadline = asyncio.get_running_loop().time() + 10
            while (now := await asyncio.to_thread(served)) != der[1] and asyncio.get_running_loop().time() < deadline:
                pass  # each handshake a poll of what the watch, running in the server's loop, hands out
            rsa_only = await asyncio.to_thread(served, "aRSA")  # the RSA pair is gone, not kept beside the new one
            write((first[0], renewed[1]))  # the certificate swapped, its key not yet
            assert not watch.reload_if_changed() and not watch.reload_if_changed()
            broken = await asyncio.to_thread(served)
            for _ in range(2):  # the files gone, then again after a good load: said each time
                write(renewed)
                assert watch.reload_if_changed()
                for path in (cert, key):
                    path.unlink()
                assert not watch.reload_if_changed()
            return [before, now, rsa_only, broken]
        finally:
            await http.stop()

    assert asyncio.run(scenario()) == [der[0], der[1], None, der[1]]
    assert caplog.text.count("changed but could not be loaded") == 3  # once per failure, however often tried
    assert "the one loaded before is served" in caplog.text


def test_a_failure_of_the_certificate_watch_is_said_and_the_watch_goes_on(tmp_path, caplog) -> None:
    for path, content in zip((tmp_path / "tls.crt", tmp_path / "tls.key"), self_signed_certificate(), strict=True):
        path.write_bytes(content)
    watch = CertificateWatch(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), interval=0.01)
    looks: list[int] = []

    def look() -> bool:
        looks.append(1)
        if len(looks) == 1:
            raise RuntimeError("a bug")
        return False

    watch.reload_if_changed = look  # type: ignore[method-assign]

    async def scenario() -> int:
        task = asyncio.create_task(watch.run())
        deadline = asyncio.get_running_loop().time() + 10
        while len(looks) < 2 and not task.done() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the watch's own interval: a poll of its looks, with a deadline
        task.cancel()
        return len(looks)

    assert asyncio.run(scenario()) >= 2
    assert "looking at the HTTPS certificate of /metrics failed" in caplog.text and "a bug" in caplog.text


@pytest.mark.parametrize(("flags", "complaint"), [
    (["--metrics-auth", "--tls-cert-file=c.pem"], "give --tls-cert-file and --tls-key-file together"),
    (["--tls-cert-file=c.pem", "--tls-key-file=k.pem"], "--tls-cert-file serves /metrics over HTTPS only with "
                                                         "--metrics-auth"),
])
def test_a_certificate_is_taken_only_whole_and_with_metrics_auth(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                                 complaint: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", *flags])
    assert exited.value.code == 2 and complaint in capsys.readouterr().err
