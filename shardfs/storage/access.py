"""How an object store is reached beyond its URL: credentials, TLS trust and S3 request options.

``Access`` is what ``Source.opened`` hands ``ObjectStorage`` (and the web store): a credential
provider (obstore's callback form; None: obstore's own resolution, or unsigned requests), the
PEM text of extra CAs to trust (added to the system's, never replacing them), ``insecure``
(no certificate verification at all: only when asked, and logged at every mount),
``requester_pays`` and the S3 ``addressing`` style. ``hint`` names where the credentials came
from, for an "access denied" line. ``client_options``/``s3_config`` are its obstore form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV_HINT = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"


@dataclass(frozen=True)
class Access:
    credentials: Callable[[], Any] | None = None
    ca_pem: str | None = None
    insecure: bool = False
    requester_pays: bool = False
    addressing: str | None = None  # "path" | "virtual" | None (obstore's default: path with an endpoint)
    hint: str = ENV_HINT

    def client_options(self) -> dict[str, Any]:
        """The obstore ``ClientConfig`` entries for TLS."""
        out: dict[str, Any] = {}
        if self.ca_pem:
            out["root_certificate"] = self.ca_pem
        if self.insecure:
            out["allow_invalid_certificates"] = True
        return out

    def s3_config(self) -> dict[str, Any]:
        """The obstore ``S3Config`` entries for requester-pays and addressing."""
        out: dict[str, Any] = {}
        if self.requester_pays:
            out["request_payer"] = True
        if self.addressing is not None:
            out["virtual_hosted_style_request"] = self.addressing == "virtual"
        return out
