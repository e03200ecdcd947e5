"""gs:// and az:// credentials through the vendors' libraries (the ``gcs`` and ``azure`` extras, issue 25).

No emulator here takes a Google or Azure bearer token from a real token service, so: Google's
Application Default Credentials are resolved by google-auth from a loopback fake of the GCE
metadata server, and the token reaches a loopback "GCS" (it answers
404: the request, with its ``Authorization`` header, is what is checked); missing credentials
fail the mount with one line (Google and Azure). Azure's shared key from the environment stays
obstore's own (Azurite tests it: test_s3_mount's az:// tests).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_s3_mount import mount_fails

pytest.importorskip("google.auth")
pytest.importorskip("azure.identity")


METADATA = {  # what a GCE metadata server answers (google-auth's compute engine credentials)
    "/": "",
    "/computeMetadata/v1/project/project-id": "shardfs-test",
    "/computeMetadata/v1/instance/service-accounts/default/": json.dumps(
        {"email": "reader@shardfs-test.iam.gserviceaccount.com", "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
         "aliases": ["default"]}),
    "/computeMetadata/v1/instance/service-accounts/default/token": json.dumps(
        {"access_token": "ya29.shardfs-test", "expires_in": 3600, "token_type": "Bearer"}),
    "/computeMetadata/v1/universe/universe-domain": "googleapis.com",
}


class Recorder:
    """A loopback HTTP server: a GCE metadata server (``METADATA``) and, for anything else, a
    store that answers 404 and keeps the ``Authorization`` header of every request."""

    def __init__(self):
        seen = self.authorization = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path.startswith("/computeMetadata/v1/instance/service-accounts/"):  # by alias or email
                    path = "/computeMetadata/v1/instance/service-accounts/default/" + (
                        "token" if path.endswith("/token") else "")
                if path in METADATA:
                    body = METADATA[path].encode()
                    self.send_response(200)
                    self.send_header("Metadata-Flavor", "Google")
                    self.send_header("Content-Type", "application/json" if body.startswith(b"{") else "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                seen.append(self.headers.get("Authorization"))
                self._answer(404, b"{}")

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def recorder():
    server = Recorder()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No GOOGLE_*/AZURE_* variable, an empty HOME (no gcloud or az configuration)."""
    import os

    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "AZURE_", "CLOUDSDK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # google-auth: no probe of the real metadata server
    return tmp_path


def test_google_adc_from_the_metadata_server_reaches_the_store(clean, recorder, monkeypatch):
    """ADC on a GCE VM or GKE node: google-auth gets a token from the metadata server (a loopback
    fake, GCE_METADATA_HOST); obstore sends it to the store."""
    from shardfs.storage.access import Access
    from shardfs.storage.cloudcredentials import google
    from shardfs.storage.objects import ObjectStorage

    host = recorder.endpoint.removeprefix("http://")
    monkeypatch.delenv("NO_GCE_CHECK")
    monkeypatch.setenv("GCE_METADATA_HOST", host)
    monkeypatch.setenv("GCE_METADATA_IP", host)
    provider, hint = google()
    assert provider is not None and provider()["token"] == "ya29.shardfs-test"
    st = ObjectStorage("gs://bucket/p", endpoint=recorder.endpoint, access=Access(credentials=provider, hint=hint))
    try:
        assert st.version("zarr.json") is None
    finally:
        st.close()
    assert recorder.authorization == ["Bearer ya29.shardfs-test"]


def test_google_missing_credentials_file_is_one_line(clean, mnt_dir):
    missing = clean / "nope.json"
    want = (f"shardfs: error: Google credentials: File {missing} was not found. (gcloud auth "
            "application-default login, or GOOGLE_APPLICATION_CREDENTIALS=FILE)\n")
    assert mount_fails("gs://bucket/p", mnt_dir, {"GOOGLE_APPLICATION_CREDENTIALS": str(missing)}) == [want, want]


def test_azure_nothing_found_is_one_line(clean, mnt_dir):
    want = ("shardfs: error: Azure credentials: DefaultAzureCredential failed to retrieve a token from the "
            "included credentials. (az login, a managed identity, or the AZURE_* variables)\n")
    assert mount_fails("az://container/p", mnt_dir, {}) == [want, want]


def test_azure_keys_in_the_environment_stay_obstores():
    from shardfs.storage.cloudcredentials import AZURE_HINT, azure

    assert azure({"AZURE_STORAGE_ACCOUNT_KEY": "k"}) == (None, AZURE_HINT)
    assert azure({"AZURE_STORAGE_USE_EMULATOR": "true"}) == (None, AZURE_HINT)
