"""The AWS credential services botocore calls, faked on loopback for the tests: STS, SSO, container
credentials and instance metadata, each handing out one fixed key pair.

``AwsFake(access_key, secret_key).start()`` serves, on ``endpoint`` (``http://127.0.0.1:PORT``):

- STS (``POST /``, form ``Action=AssumeRole`` or ``AssumeRoleWithWebIdentity``): the XML answer;
- SSO (``GET /federation/credentials``, the ``x-amz-sso_bearer_token`` header): the JSON answer;
- container credentials (``GET /container``): ``AWS_CONTAINER_CREDENTIALS_FULL_URI``'s JSON;
- instance metadata (IMDSv2: ``PUT /latest/api/token``, then
  ``GET /latest/meta-data/iam/security-credentials/[ROLE]``).

Every answer carries the key pair, an **empty** session token (SeaweedFS, the S3 server of the
tests, rejects session tokens it did not issue; an empty one is sent as none) and an expiry one
hour ahead. ``calls`` counts the requests by kind (``sts:AssumeRole``, ``sso``, ``container``,
``imds``...), and ``web_tokens`` keeps the web identity tokens STS was given. ``close()`` stops it.
"""

from __future__ import annotations

import collections
import datetime
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

ROLE = "shardfs-test-role"


def _expiry() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(hours=1)


class AwsFake:
    def __init__(self, access_key: str, secret_key: str):
        self.access_key, self.secret_key = access_key, secret_key
        self.calls: collections.Counter[str] = collections.Counter()
        self.web_tokens: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token":
                    fake.calls["imds-token"] += 1
                    self._send(200, "imds-session-token", "text/plain")
                else:
                    self._send(404, "")

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/container":
                    fake.calls["container"] += 1
                    self._send(200, json.dumps(fake.document()))
                elif path == "/latest/meta-data/iam/security-credentials/":
                    self._send(200, ROLE, "text/plain")
                elif path == f"/latest/meta-data/iam/security-credentials/{ROLE}":
                    fake.calls["imds"] += 1
                    self._send(200, json.dumps({"Code": "Success", "Type": "AWS-HMAC", **fake.document()}))
                elif path == "/federation/credentials":
                    fake.calls["sso"] += 1
                    expiry = int(_expiry().timestamp() * 1000)
                    self._send(200, json.dumps({"roleCredentials": {
                        "accessKeyId": fake.access_key, "secretAccessKey": fake.secret_key, "sessionToken": "",
                        "expiration": expiry}}))
                else:
                    self._send(404, "")

            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                action = (form.get("Action") or [""])[0]
                fake.calls[f"sts:{action}"] += 1
                if action == "AssumeRoleWithWebIdentity":
                    fake.web_tokens.append((form.get("WebIdentityToken") or [""])[0])
                if action not in ("AssumeRole", "AssumeRoleWithWebIdentity"):
                    self._send(400, "", "text/xml")
                    return
                self._send(200, f"""<{action}Response xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <{action}Result>
    <Credentials>
      <AccessKeyId>{fake.access_key}</AccessKeyId>
      <SecretAccessKey>{fake.secret_key}</SecretAccessKey>
      <SessionToken></SessionToken>
      <Expiration>{_expiry().isoformat().replace("+00:00", "Z")}</Expiration>
    </Credentials>
    <AssumedRoleUser><AssumedRoleId>AROA:s</AssumedRoleId><Arn>arn:aws:sts::123456789012:assumed-role/r/s</Arn></AssumedRoleUser>
  </{action}Result>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</{action}Response>""", "text/xml")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def document(self) -> dict:
        """The container/instance credential document."""
        return {"AccessKeyId": self.access_key, "SecretAccessKey": self.secret_key, "Token": "",
                "Expiration": _expiry().isoformat().replace("+00:00", "Z")}

    def start(self) -> AwsFake:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
