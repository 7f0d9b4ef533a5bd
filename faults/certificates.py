"""A throw-away certificate authority for TLS and SASL_SSL runs (the tests,
the TLS benchmark): a CA and certificates signed by it, written as PEM
files, made with ``cryptography`` (a test dependency, imported on use)."""

from __future__ import annotations


class TestCA:
    """A throw-away certificate authority for TLS tests (``cryptography``):
    ``ca.pem`` and a broker certificate for 127.0.0.1/localhost signed by it
    (``server.pem`` + ``server.key``), written into ``directory``;
    ``issue(name, common_name)`` signs more (client certificates, a server
    certificate from another CA for the untrusted case)."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, directory, *, name: str = "onceflow test CA"):
        import datetime
        import os

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._serialization, self._ec, self._oid = x509, hashes, serialization, ec, NameOID
        self.directory = str(directory)
        os.makedirs(self.directory, exist_ok=True)
        self._now = datetime.datetime.now(datetime.UTC)
        self._valid = datetime.timedelta(days=2)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + self._valid)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cafile = self._write("ca.pem", self.certificate.public_bytes(serialization.Encoding.PEM))
        self.certfile, self.keyfile = self.issue("server", "localhost", server=True)

    def _write(self, filename: str, data: bytes) -> str:
        import os

        path = os.path.join(self.directory, filename)
        with open(path, "wb") as handle:
            handle.write(data)
        return path

    def issue(self, filename: str, common_name: str, *, server: bool = False) -> tuple[str, str]:
        """Sign a certificate for ``common_name``; returns (certificate PEM path, key PEM path)."""
        import datetime
        import ipaddress

        x509, NameOID = self._x509, self._oid
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + self._valid)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, self._hashes.SHA256())
        serialization = self._serialization
        certfile = self._write(f"{filename}.pem", certificate.public_bytes(serialization.Encoding.PEM))
        keyfile = self._write(
            f"{filename}.key",
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        )
        return certfile, keyfile
