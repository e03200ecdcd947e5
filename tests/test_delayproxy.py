"""The bench's DelayProxy (testkit/delayproxy.py) counts the requests sent through it.

Real obstore requests against the session's SeaweedFS, through a proxy without delay: every kind
of request is counted exactly once, a PUT's body (which holds text looking like a request) is
skipped by its Content-Length, and the bytes the server answered are counted.
"""

from __future__ import annotations

import uuid

import obstore
from obstore.store import S3Store

from testkit.delayproxy import DelayProxy, Request
from s3server import ACCESS_KEY, REGION, SECRET_KEY


def test_requests_counted_by_kind(s3):
    body = b"GET /shardfs-test/x HTTP/1.1\r\nHost: h\r\n\r\n" * 100
    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0.0, record=True) as proxy:
        store = S3Store(s3.bucket, config={"endpoint": f"http://127.0.0.1:{proxy.port}", "region": REGION,
                                           "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
                        client_options={"allow_http": True})
        key = f"proxy-{uuid.uuid4().hex[:8]}/k"
        obstore.put(store, key, body)
        assert obstore.head(store, key)["size"] == len(body)
        assert bytes(obstore.get(store, key, options={"range": (0, 3)}).bytes()) == b"GET"
        assert bytes(obstore.get(store, key).bytes()) == body
        assert [m["path"] for batch in obstore.list(store, key.split("/")[0]) for m in batch] == [key]
        requests, down = proxy.snapshot()
    assert requests == {"PUT": 1, "HEAD": 1, "GET": 2, "LIST": 1}
    assert down > len(body) + 3
    path = f"/{s3.bucket}/{key}"
    assert [(r.method, r.path, r.headers.get("range"), r.headers.get("content-length")) for r in proxy.log] == [
        ("PUT", path, None, str(len(body))), ("HEAD", path, None, None), ("GET", path, "bytes=0-2", None),
        ("GET", path, None, None), ("LIST", f"/{s3.bucket}", None, None)]
    assert all(isinstance(r, Request) for r in proxy.log) and "list-type=2" in proxy.log[-1].query


def test_a_held_request_reaches_the_server_only_once_released(s3):
    """``hold``: a matching PUT waits in the proxy (the server still has the old object, another
    client reading it meanwhile) until ``release``; the requests after it are not held."""
    import threading

    with DelayProxy(("127.0.0.1", s3.ports["s3.port"]), delay=0.0, record=True) as proxy:
        store = S3Store(s3.bucket, config={"endpoint": f"http://127.0.0.1:{proxy.port}", "region": REGION,
                                           "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY},
                        client_options={"allow_http": True})
        direct = S3Store(s3.bucket, config={"endpoint": s3.endpoint, "region": REGION, "access_key_id": ACCESS_KEY,
                                            "secret_access_key": SECRET_KEY}, client_options={"allow_http": True})
        key = f"proxy-{uuid.uuid4().hex[:8]}/k"
        obstore.put(store, key, b"old")
        proxy.hold(lambda r: r.method == "PUT")
        put = threading.Thread(target=obstore.put, args=(store, key, b"new"))
        put.start()
        try:
            for _ in range(300):
                if proxy.held:
                    break
                put.join(0.1)
            assert [(r.method, r.path) for r in proxy.held] == [("PUT", f"/{s3.bucket}/{key}")]
            put.join(1.0)
            assert put.is_alive() and bytes(obstore.get(direct, key).bytes()) == b"old"
        finally:
            proxy.release()
            put.join(30)
        assert not put.is_alive() and bytes(obstore.get(direct, key).bytes()) == b"new"
        obstore.put(store, key, b"newer")  # not held: released
        assert len(proxy.held) == 1 and bytes(obstore.get(direct, key).bytes()) == b"newer"
