"""How s3:// requests are made (issue 25): TLS with a private CA, requester pays, addressing.

TLS: a TLS-terminating proxy (tests/tlsproxy.py, a CA made by openssl) in front of the session's
SeaweedFS. The CA is trusted through ``-o ca_bundle``, ``AWS_CA_BUNDLE`` or the profile's
``ca_bundle``: each mounts and zarr 2.18 reads exactly. Without it the mount fails with one line
naming the TLS failure; ``-o insecure`` mounts and says so in the log once at every mount (with
N workers too).
``-o requester_pays`` puts ``x-amz-request-payer: requester`` on every request (seen by a
recording proxy); ``-o addressing`` picks path style (seen) or virtual hosts (the store's
configuration: loopback has no per-bucket host names).
"""

from __future__ import annotations

import pytest
from awshome import LAB_KEYS, S, reads_exactly, write_aws
from testkit.delayproxy import DelayProxy
from testkit.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, upload
from conftest import read_native, read_zarr2
from sources import build
from test_s3_mount import mount_fails
from tlsproxy import TlsProxy, make_ca, make_self_signed


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def tls(s3, certs):
    """The https endpoint in front of the session's SeaweedFS."""
    proxy = TlsProxy(int(s3.endpoint.rsplit(":", 1)[1]), certs)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def keys(monkeypatch, home):
    """The server's keys and region in the environment; no endpoint (each test gives its own)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    return home


def test_ca_bundle_option(mount, src, keys, tls, certs):
    reads_exactly(mount, src, "-o", f"endpoint={tls.endpoint},ca_bundle={certs.ca}")


def test_aws_ca_bundle_variable(mount, src, keys, tls, certs, monkeypatch):
    monkeypatch.setenv("AWS_CA_BUNDLE", str(certs.ca))
    monkeypatch.setenv("AWS_ENDPOINT_URL", tls.endpoint)
    reads_exactly(mount, src)


def test_profile_ca_bundle(mount, src, home, tls, certs):
    write_aws(home, f"[profile lab]\nregion = {REGION}\nendpoint_url = {tls.endpoint}\nca_bundle = {certs.ca}\n",
              LAB_KEYS)
    reads_exactly(mount, src, "-o", "profile=lab")


def test_untrusted_ca_is_one_line(src, keys, tls, mnt_dir):
    want = (f"shardfs: error: {src[1].url}: TLS certificate verification failed (UnknownIssuer): trust the "
            "server's CA with -o ca_bundle=FILE or AWS_CA_BUNDLE\n")
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", f"endpoint={tls.endpoint}") == [want, want]
    assert tls.handshakes_failed >= 2


@pytest.mark.parametrize("workers", [1, 2])
def test_insecure_mounts_and_warns_at_every_mount(mount, src, keys, tls, workers):
    """Once at each mount, whatever its workers (a mount's warning, not each worker's)."""
    if workers > 1 and "workers" not in __import__("importlib.metadata").metadata.version("pyfuse3"):
        pytest.skip("needs the pyfuse3 scripts/pyfuse3 builds (-o workers=N)")
    warning = "TLS certificates are not verified (-o insecure)"
    for _ in range(2):
        mnt = reads_exactly(mount, src, "-o", f"endpoint={tls.endpoint},insecure,workers={workers}")
        log = mount.info(mnt).log_text()
        assert sum(warning in line and "WARNING" in line for line in log.splitlines()) == 1, log


def test_bad_ca_bundle_is_one_line(src, keys, tls, mnt_dir, tmp_path):
    (tmp_path / "not.pem").write_text("hello\n")
    want = f"shardfs: error: ca_bundle {tmp_path / 'not.pem'}: no PEM certificate in it\n"
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", f"endpoint={tls.endpoint},ca_bundle={tmp_path / 'not.pem'}") \
        == [want, want]
    want = f"shardfs: error: ca_bundle {tmp_path / 'none.pem'}: no such file\n"
    assert mount_fails(src[1].url, mnt_dir, {}, "-o", f"endpoint={tls.endpoint},ca_bundle={tmp_path / 'none.pem'}") \
        == [want, want]


# ------------------------------------------------------------------ requester pays, addressing


@pytest.fixture
def recorded(s3):
    """A recording proxy in front of the session's SeaweedFS."""
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0, record=True) as proxy:
        yield proxy


@pytest.mark.parametrize("pays", [True, False])
def test_requester_pays_header_on_every_request(mount, src, keys, recorded, pays):
    opts = f"endpoint=http://127.0.0.1:{recorded.port},addressing=path" + (",requester_pays" if pays else "")
    reads_exactly(mount, src, "-o", opts)
    seen = [r for r in recorded.log if src[1].prefix in r.path or src[1].prefix in r.query]
    assert len(seen) >= 3
    assert {r.headers.get("x-amz-request-payer") for r in seen} == ({"requester"} if pays else {None})
    assert all(r.path.startswith(f"/{src[1].server.bucket}") for r in seen), "path style: /BUCKET/KEY"


@pytest.mark.parametrize(("addressing", "endpoint"), [("virtual", "https://bkt.store.example:9000"),
                                                      ("path", "https://store.example:9000")])
def test_virtual_addressing_puts_the_bucket_in_the_host(addressing, endpoint):
    """Not against a server (loopback has no per-bucket host names): the store obstore is given."""
    from shardfs.storage.access import Access
    from shardfs.storage.objects import ObjectStorage

    st = ObjectStorage("s3://bkt/p", endpoint="https://store.example:9000", region=REGION,
                       access=Access(addressing=addressing))
    try:
        assert st.requests.store.config["endpoint"] == endpoint
        assert st.requests.store.config["virtual_hosted_style_request"] == str(addressing == "virtual").lower()
    finally:
        st.close()


# ------------------------------------------------------------------ a web server over https


def test_web_server_over_https_with_a_private_ca(tmp_path, web_server, certs, mount, mnt_dir):
    """https://host/array through the TLS proxy in front of nginx: trusted with -o ca_bundle; not: one line."""
    build(tmp_path / "www", [S])
    server = web_server(tmp_path / "www")
    proxy = TlsProxy(server.port, certs)
    try:
        url = f"{proxy.endpoint}/s"
        mnt = mount(url, "-o", f"ca_bundle={certs.ca}")
        assert (read_zarr2(mnt) == read_native(tmp_path / "www" / "s")).all()
        want = (f"shardfs: error: {url}: TLS certificate verification failed (UnknownIssuer): trust the "
                "server's CA with -o ca_bundle=FILE\n")
        assert mount_fails(url, mnt_dir, {}) == [want, want]
    finally:
        proxy.close()


# ------------------------------------------------------------------ anonymous access (issue 34)


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    """A SeaweedFS of its own whose bucket unsigned requests may list and read (stopped by PID)."""
    server = SeaweedS3(tmp_path_factory.mktemp("public"), anonymous_read=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["AWS_SKIP_SIGNATURE", "option"])
def test_public_bucket_reads_without_credentials(mount, home, public, tmp_path, mnt_dir, monkeypatch, how):
    """No credentials anywhere: the mount fails with the line naming ``-o anonymous``; with it, or
    with ``AWS_SKIP_SIGNATURE=true`` (obstore's own variable), zarr 2.18 reads the public bucket."""
    build(tmp_path / "pub", [S])
    up = upload(public, tmp_path / "pub")
    monkeypatch.setenv("AWS_ENDPOINT_URL", public.endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    for said in mount_fails(up.url, mnt_dir, {}, "-o", "ro"):
        assert said.startswith("shardfs: error: no AWS credentials found (") and \
            said.endswith("; -o anonymous reads public data without them\n"), said
    if how == "option":
        reads_exactly(mount, (tmp_path / "pub", up), "-o", "ro,anonymous")
    else:
        monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")
        reads_exactly(mount, (tmp_path / "pub", up), "-o", "ro")


# ------------------------------------------------------------------ a self-signed server certificate (issue 34)


@pytest.mark.parametrize("how", ["option", "AWS_CA_BUNDLE"])
def test_self_signed_ca_certificate_names_the_cause_and_the_fix_that_works(src, keys, s3, tmp_path, mnt_dir,
                                                                          mount, monkeypatch, how):
    """A server certificate made by ``openssl req -x509`` (CA:TRUE) and trusted through ``-o
    ca_bundle`` or ``AWS_CA_BUNDLE``: OpenSSL (what the AWS CLI uses) verifies it; rustls, which
    obstore uses and offers no other verifier, refuses a CA certificate as a server's own. The
    mount fails with one line naming that cause and the fix; the fix it names (the same
    certificate made with CA:FALSE) mounts, and zarr 2.18 reads exactly."""
    import socket
    import ssl

    upstream = int(s3.endpoint.rsplit(":", 1)[1])
    certs = make_self_signed(tmp_path / "ca-true", ca=True)
    proxy = TlsProxy(upstream, certs)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as raw, \
                ssl.create_default_context(cafile=str(certs.ca)).wrap_socket(raw, server_hostname="127.0.0.1"):
            pass  # OpenSSL verifies it (as the AWS CLI does)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        if how == "AWS_CA_BUNDLE":
            monkeypatch.setenv("AWS_CA_BUNDLE", str(certs.ca))
        opts = ("-o", f"ca_bundle={certs.ca}") if how == "option" else ()
        want = (f"shardfs: error: {src[1].url}: TLS certificate verification failed (CaUsedAsEndEntity): the "
                "server's certificate is a CA certificate (basicConstraints CA:TRUE, as openssl req -x509 makes by "
                "default), which rustls refuses as a server's own even when trusted: give the server a certificate "
                "with CA:FALSE (openssl req -x509 -addext basicConstraints=critical,CA:FALSE ...) or one signed by "
                "a CA, and trust that\n")
        assert mount_fails(src[1].url, mnt_dir, {}, *opts) == [want, want]
    finally:
        proxy.close()
    fixed = make_self_signed(tmp_path / "ca-false", ca=False)
    proxy = TlsProxy(upstream, fixed)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        if how == "AWS_CA_BUNDLE":
            monkeypatch.setenv("AWS_CA_BUNDLE", str(fixed.ca))
        reads_exactly(mount, src, *(("-o", f"ca_bundle={fixed.ca}") if how == "option" else ()))
    finally:
        proxy.close()
