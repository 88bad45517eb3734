"""Certificates made by openssl for a test or a benchmark: a CA and a server certificate."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate it signed for 127.0.0.1, and a CA that signed nothing here."""

    ca: Path
    certificate: Path
    key: Path
    other_ca: Path


def openssl(folder: Path, *args: str) -> None:
    """Run ``openssl`` in ``folder``; raises on failure."""
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)


def make_pki(folder: Path) -> Pki:
    """Write the CAs, the server's key and its certificate (IP 127.0.0.1, DNS localhost)."""
    for name, subject in (("ca", "/CN=gateway test CA"), ("other", "/CN=an untrusted CA")):
        openssl(folder, "req", "-x509", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.pem",
                "-days", "2", "-subj", subject)  # fmt: skip
    openssl(folder, "req", *EC_KEY, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=gateway")  # fmt: skip
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "server.ext")  # fmt: skip
    return Pki(
        folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "other.pem"
    )
