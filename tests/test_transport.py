"""The HTTP transport against a real loopback server: keep-alive, reconnects, TLS with a CA bundle."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import stepwatch
from stepwatch._transport import HTTPTransport, TokenSource, TransportError
from stepwatch.testing import ReportSink


def test_requests_share_one_kept_alive_connection(sink: ReportSink) -> None:
    run = stepwatch.init(job="keepalive", url=sink.url, interval=0.02)
    for _ in range(20):
        run.step(loss=1.0)
    assert sink.wait_for(lambda s: len(s.received) >= 5)
    assert run.finish()
    ports = {r.client_port for r in sink.received}
    assert len(ports) == 1, ports


def test_a_server_that_closed_the_connection_is_reconnected_transparently(sink: ReportSink) -> None:
    transport = HTTPTransport()
    first = transport.request("POST", sink.url + "/nowhere", headers={}, body=b"{}", timeout=5)
    sink.down()  # cuts the kept-alive connection
    sink.up()
    second = transport.request("POST", sink.url + "/nowhere", headers={}, body=b"{}", timeout=5)
    assert first.status == second.status == 404
    assert sink.received[0].client_port != sink.received[1].client_port
    transport.close()


def test_the_sink_listens_below_the_ephemeral_ports_so_up_finds_its_port_free(sink: ReportSink) -> None:
    """Between down() and up() an outgoing connection of a parallel test could take an ephemeral port as its
    local end (seen once: ``Address already in use`` at up()); the kernel never hands out ports below that range."""
    low, _ = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    port = int(sink.url.rsplit(":", 1)[1])
    assert port < low
    sink.down()
    sink.up()
    assert int(sink.url.rsplit(":", 1)[1]) == port


def test_connection_failures_are_transport_errors() -> None:
    transport = HTTPTransport()
    with pytest.raises(TransportError, match=r"Connection refused|ConnectionRefused"):
        transport.request("POST", "http://127.0.0.1:9/x", headers={}, body=b"", timeout=2)
    with pytest.raises(TransportError, match="unsupported URL"):
        transport.request("POST", "ftp://example/x", headers={}, body=b"", timeout=2)
    with pytest.raises(TransportError, match="cannot set up TLS"):
        HTTPTransport(ca_cert="/nonexistent/ca.pem").request(
            "POST", "https://127.0.0.1:9/x", headers={}, body=b"", timeout=2
        )


def test_a_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    source = TokenSource(path=str(path))
    assert source.header() == {"Authorization": "Bearer one"}
    path.write_text("two-longer\n")  # kubelet rotates projected tokens by replacing the file
    assert source.get() == "two-longer"
    path.unlink()
    assert source.get() == "two-longer" and source.error and "cannot read token file" in source.error
    assert TokenSource(token="  t  ").get() == "t" and TokenSource().header() == {}


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (made with openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "1", "-subj", "/CN=stepwatch test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "1", "-extfile", "san.ext")  # fmt: skip
    return str(tmp_path / "ca.crt"), str(tmp_path / "server.crt"), str(tmp_path / "server.key")


def test_https_with_the_ca_bundle_of_the_environment(
    certificates: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = certificates
    with ReportSink(tls_cert=cert, tls_key=key) as sink:
        monkeypatch.setenv("STEPWATCH_CA_CERT", ca)
        run = stepwatch.init(job="tls", url=sink.url, interval=0.05)
        run.step(loss=1.0)
        assert run.finish()
        assert sink.final() is not None


def test_https_without_the_ca_is_refused_and_training_goes_on(certificates: tuple[str, str, str]) -> None:
    _, cert, key = certificates
    with ReportSink(tls_cert=cert, tls_key=key) as sink:
        run = stepwatch.init(job="tls", url=sink.url, interval=0.05, flush_timeout=0.5)
        run.step(loss=1.0)
        sender = run._sender
        assert sender is not None
        assert run.finish() is False
        assert "CERTIFICATE_VERIFY_FAILED" in (sender.last_error or "")
        assert sink.reports == []
