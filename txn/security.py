"""Our clients' security settings and their client-side SASL exchange.

``SecurityConfig`` is the one value every client connection is opened with:
the security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), the SASL
mechanism and credentials, and the TLS files. It is parsed once, from
whichever spelling the caller uses: our Python names (``sasl_username``),
Kafka's dotted names as the Java client, librdkafka and Spark's Kafka
connector write them (``security.protocol``, ``sasl.mechanism``,
``ssl.ca.location``, ``ssl.truststore.location`` with type PEM,
``sasl.jaas.config`` with a PLAIN or SCRAM login module), and kafka-python's
(``sasl_plain_username``). An unknown value is a ``ConfigError`` that lists
the valid ones. The password never appears in a repr, a log line or an
exception.

``SaslClient`` is the client side of SaslHandshake v1 + SaslAuthenticate as a
sans-I/O state machine (one state table): it says what to send and checks
what comes back. For SCRAM (RFC 5802, RFC 7677) it makes the client nonce,
checks that the server's nonce extends it and that the iteration count is
one Kafka allows, sends the proof, and verifies the server's signature: a
server that cannot prove it holds the user's credential is refused, even
though it said the exchange succeeded. ``txn.connection`` drives it.
"""

from __future__ import annotations

import enum
import hmac
import re
import ssl

import attrs

from protocol import scram
from protocol.errors import ErrorCode
from protocol.properties import parse_bool
from txn.errors import ConfigError, InvalidConfigurationError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
REDACTED = "[hidden]"

# Every option name that is a security setting, in the form ``txn.config``
# normalises names to (dots and dashes to underscores), and the field it sets.
# ``sasl_jaas_config``, ``ssl_truststore_*`` and ``ssl_endpoint_identification_algorithm``
# are translated by ``SecurityConfig.build``.
OPTION_FIELDS = {
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_mechanisms": "sasl_mechanism",  # librdkafka's spelling
    "sasl_username": "sasl_username",
    "sasl_password": "sasl_password",
    "sasl_plain_username": "sasl_username",  # kafka-python's
    "sasl_plain_password": "sasl_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_ca_location": "ssl_cafile",  # librdkafka's
    "ssl_certfile": "ssl_certfile",
    "ssl_certificate_location": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_key_location": "ssl_keyfile",
    "ssl_key_password": "ssl_key_password",
    "ssl_password": "ssl_key_password",  # kafka-python's
    "ssl_check_hostname": "ssl_check_hostname",
}
TRANSLATED_OPTIONS = {"sasl_jaas_config", "ssl_truststore_location", "ssl_truststore_type", "ssl_endpoint_identification_algorithm"}
OPTION_NAMES = frozenset(OPTION_FIELDS) | TRANSLATED_OPTIONS

JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}
JAAS_OPTION = re.compile(r'\s*([A-Za-z_][\w.]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _protocol(value) -> str:
    name = str(value).strip().upper()
    if name not in PROTOCOLS:
        raise ConfigError(f"security_protocol must be one of {', '.join(PROTOCOLS)}, not {value!r}")
    return name


def _mechanism(value) -> str:
    name = str(value).strip().upper()
    if name not in SASL_MECHANISMS:
        raise ConfigError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, not {value!r}")
    return name


def _optional_text(value) -> str | None:
    return None if value is None or value == "" else str(value)


@attrs.frozen(kw_only=True)
class SecurityConfig:
    """How a client connects: in plain text or TLS, with or without SASL."""

    security_protocol: str = attrs.field(default="PLAINTEXT", converter=_protocol)
    sasl_mechanism: str = attrs.field(default="PLAIN", converter=_mechanism)
    sasl_username: str | None = attrs.field(default=None, converter=_optional_text)
    sasl_password: str | None = attrs.field(default=None, converter=_optional_text, repr=lambda value: REDACTED if value else repr(value))
    ssl_cafile: str | None = attrs.field(default=None, converter=_optional_text)  # None: the system's trust store
    ssl_certfile: str | None = attrs.field(default=None, converter=_optional_text)  # a client certificate (mutual TLS)
    ssl_keyfile: str | None = attrs.field(default=None, converter=_optional_text)
    ssl_key_password: str | None = attrs.field(default=None, converter=_optional_text, repr=lambda value: REDACTED if value else repr(value))
    ssl_check_hostname: bool = attrs.field(default=True, converter=parse_bool)

    def __attrs_post_init__(self) -> None:
        if self.uses_sasl and (not self.sasl_username or self.sasl_password is None):
            raise ConfigError(f"security_protocol {self.security_protocol} needs sasl_username and sasl_password (sasl.username, sasl.password)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("ssl_keyfile (ssl.key.location) needs ssl_certfile (ssl.certificate.location)")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def build(cls, options: dict | None = None, *, base: SecurityConfig | None = None) -> SecurityConfig:
        """A config from security options in any supported spelling (names
        already normalised or not), over ``base``'s values."""
        fields = {} if base is None else attrs.asdict(base, recurse=False)
        given = {normalise(name): value for name, value in (options or {}).items()}
        unknown = sorted(set(given) - OPTION_NAMES)
        if unknown:
            raise ConfigError(f"unknown security option(s): {', '.join(unknown)}")
        jaas = given.pop("sasl_jaas_config", None)
        if jaas:
            fields.update(parse_jaas_config(str(jaas)))
        truststore = given.pop("ssl_truststore_location", None)
        truststore_type = str(given.pop("ssl_truststore_type", "PEM") or "PEM").upper()
        if truststore:
            if truststore_type != "PEM":
                raise ConfigError(
                    f"ssl.truststore.type {truststore_type} is not supported: our clients read PEM files "
                    "(ssl.truststore.type=PEM, or ssl.ca.location=FILE)"
                )
            fields["ssl_cafile"] = truststore
        algorithm = given.pop("ssl_endpoint_identification_algorithm", None)
        if algorithm is not None:
            if str(algorithm).lower() not in ("https", "", "none"):
                raise ConfigError(f"ssl.endpoint.identification.algorithm must be https or empty, not {algorithm!r}")
            fields["ssl_check_hostname"] = str(algorithm).lower() == "https"
        for name, value in given.items():
            fields[OPTION_FIELDS[name]] = value
        return cls(**fields)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a connection (None for a plain-text protocol):
        the CA file's certificates are trusted (else the system's), the
        broker's name is checked against its certificate, TLS 1.2 at least."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_key_password)
        except (OSError, ssl.SSLError) as error:
            # The files' paths are the user's and fine to show; the key password is not in the message.
            raise ConfigError(f"cannot load the TLS files (ssl_cafile={self.ssl_cafile}, ssl_certfile={self.ssl_certfile}): {error}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.ssl_check_hostname
        return context


PLAINTEXT = SecurityConfig()


def normalise(name: str) -> str:
    return str(name).replace(".", "_").replace("-", "_").lower()


def is_security_option(name: str) -> bool:
    return normalise(name) in OPTION_NAMES


def parse_jaas_config(text: str) -> dict:
    """``sasl.jaas.config`` as the Java client writes it, for the login
    modules of PLAIN and SCRAM:

        org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="secret";

    -> {"sasl_username": "alice", "sasl_password": "secret"}. Other modules
    (GSSAPI, OAUTHBEARER) are a ConfigError."""
    match = re.match(r"\s*([\w.]+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;?\s*$", text, re.DOTALL)
    if not match:
        raise ConfigError("sasl.jaas.config must read '<LoginModule> required username=\"...\" password=\"...\";'")
    module, _flag, rest = match.groups()
    if module not in JAAS_MODULES:
        raise ConfigError(f"sasl.jaas.config: login module {module} is not supported (supported: {', '.join(JAAS_MODULES)})")
    values = {}
    position = 0
    while position < len(rest):
        option = JAAS_OPTION.match(rest, position)
        if option is None:
            raise ConfigError("sasl.jaas.config: options must be written name=\"value\"")
        values[option.group(1)] = re.sub(r"\\(.)", r"\1", option.group(2))
        position = option.end()
        while position < len(rest) and rest[position].isspace():
            position += 1
    if "username" not in values or "password" not in values:
        raise ConfigError("sasl.jaas.config needs username=\"...\" and password=\"...\"")
    return {"sasl_username": values["username"], "sasl_password": values["password"]}


# -- errors ------------------------------------------------------------------------------------------


class AuthenticationError(InvalidConfigurationError):
    """The broker refused our credentials, a SCRAM server failed to prove
    itself, or the TLS handshake failed (an untrusted certificate). Not
    retriable: the same settings would fail the same way."""


# -- the SASL exchange ---------------------------------------------------------------------------------


class SaslState(enum.Enum):
    NEW = "new"
    HANDSHAKE_SENT = "handshake sent"
    PLAIN_SENT = "PLAIN credentials sent"
    CLIENT_FIRST_SENT = "SCRAM client-first sent"
    CLIENT_FINAL_SENT = "SCRAM client-final sent"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class SaslEvent(enum.Enum):
    SEND_HANDSHAKE = "send handshake"
    MECHANISM_ACCEPTED_PLAIN = "mechanism accepted (PLAIN)"
    MECHANISM_ACCEPTED_SCRAM = "mechanism accepted (SCRAM)"
    SERVER_FIRST = "server-first received"
    SUCCESS = "success"
    FAILURE = "failure"


S, E = SaslState, SaslEvent
TRANSITIONS = {
    (S.NEW, E.SEND_HANDSHAKE): S.HANDSHAKE_SENT,
    (S.HANDSHAKE_SENT, E.MECHANISM_ACCEPTED_PLAIN): S.PLAIN_SENT,
    (S.HANDSHAKE_SENT, E.MECHANISM_ACCEPTED_SCRAM): S.CLIENT_FIRST_SENT,
    (S.PLAIN_SENT, E.SUCCESS): S.AUTHENTICATED,
    (S.CLIENT_FIRST_SENT, E.SERVER_FIRST): S.CLIENT_FINAL_SENT,
    (S.CLIENT_FINAL_SENT, E.SUCCESS): S.AUTHENTICATED,
    **{(state, E.FAILURE): S.FAILED for state in (S.HANDSHAKE_SENT, S.PLAIN_SENT, S.CLIENT_FIRST_SENT, S.CLIENT_FINAL_SENT)},
}
del S, E


class SaslClient:
    """One authentication of one connection (a re-authentication is a new
    ``SaslClient`` on the same connection).

        client = SaslClient(config)
        handshake = client.handshake_request()          # SaslHandshake v1 body
        token = client.receive_handshake(response)      # first auth_bytes
        while token is not None:                        # SaslAuthenticate
            token = client.receive_authenticate(response)
        client.session_lifetime_ms                      # 0: no limit

    Every refusal raises ``AuthenticationError`` and leaves the machine FAILED.
    """

    def __init__(self, config: SecurityConfig, *, nonce: str | None = None):
        if not config.uses_sasl:
            raise ValueError(f"{config.security_protocol} does not use SASL")
        self.mechanism = config.sasl_mechanism
        self._username = config.sasl_username
        self._password = config.sasl_password
        self.state = SaslState.NEW
        self.session_lifetime_ms = 0
        self._client_nonce = nonce or scram.new_nonce()
        self._client_first_bare = ""
        self._expected_server_signature = b""

    def __repr__(self) -> str:
        return f"SaslClient({self.mechanism}, user={self._username!r}, state={self.state.value})"

    def _transition(self, event: SaslEvent) -> None:
        next_state = TRANSITIONS.get((self.state, event))
        if next_state is None:
            raise AuthenticationError(ErrorCode.ILLEGAL_SASL_STATE, "SASL", message=f"{event.value} is not expected in state {self.state.value}")
        self.state = next_state

    def _fail(self, message: str, code: int = ErrorCode.SASL_AUTHENTICATION_FAILED) -> AuthenticationError:
        if (self.state, SaslEvent.FAILURE) in TRANSITIONS:
            self._transition(SaslEvent.FAILURE)
        return AuthenticationError(code, f"SASL {self.mechanism} as {self._username!r}", message=message)

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.AUTHENTICATED

    # -- the handshake ---------------------------------------------------------------------------

    def handshake_request(self) -> dict:
        self._transition(SaslEvent.SEND_HANDSHAKE)
        return {"mechanism": self.mechanism}

    def receive_handshake(self, body: dict) -> bytes:
        """The broker's SaslHandshake answer; returns the first auth_bytes."""
        if body["error_code"]:
            offered = ", ".join(body.get("mechanisms") or []) or "none"
            if body["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM:
                raise self._fail(f"the broker does not enable {self.mechanism} (it offers: {offered})", body["error_code"])
            raise self._fail(f"SaslHandshake refused: {ErrorCode(body['error_code']).name if body['error_code'] in ErrorCode._value2member_map_ else body['error_code']}", body["error_code"])
        if self.mechanism == "PLAIN":
            self._transition(SaslEvent.MECHANISM_ACCEPTED_PLAIN)
            # RFC 4616: authzid NUL authcid NUL passwd (no authzid: act as ourselves).
            return b"\0" + self._username.encode("utf-8") + b"\0" + self._password.encode("utf-8")
        self._transition(SaslEvent.MECHANISM_ACCEPTED_SCRAM)
        self._client_first_bare = f"n={scram.escape_username(self._username)},r={self._client_nonce}"
        return ("n,," + self._client_first_bare).encode("utf-8")

    # -- SaslAuthenticate ------------------------------------------------------------------------

    def receive_authenticate(self, body: dict) -> bytes | None:
        """One SaslAuthenticate answer; returns the next auth_bytes to send,
        or None once authenticated."""
        if body["error_code"]:
            message = body.get("error_message") or "authentication failed"
            raise self._fail(f"the broker refused: {message}", body["error_code"])
        if self.state is SaslState.PLAIN_SENT:
            self._transition(SaslEvent.SUCCESS)
            self.session_lifetime_ms = int(body.get("session_lifetime_ms") or 0)
            return None
        if self.state is SaslState.CLIENT_FIRST_SENT:
            return self._client_final(bytes(body["auth_bytes"]))
        if self.state is SaslState.CLIENT_FINAL_SENT:
            self._verify_server_final(bytes(body["auth_bytes"]))
            self._transition(SaslEvent.SUCCESS)
            self.session_lifetime_ms = int(body.get("session_lifetime_ms") or 0)
            return None
        raise self._fail(f"a SaslAuthenticate answer is not expected in state {self.state.value}", ErrorCode.ILLEGAL_SASL_STATE)

    def _client_final(self, server_first_bytes: bytes) -> bytes:
        mechanism = scram.MECHANISMS[self.mechanism]
        try:
            server_first = server_first_bytes.decode("utf-8")
            attributes = scram.parse_attributes(server_first)
            nonce, salt_text, iterations_text = attributes["r"], attributes["s"], attributes["i"]
            salt = scram.b64decode(salt_text)
            iterations = int(iterations_text)
        except (UnicodeDecodeError, scram.ScramError, KeyError, ValueError) as error:
            raise self._fail(f"malformed SCRAM server-first message ({type(error).__name__})") from None
        if "m" in attributes:
            raise self._fail("the broker asks for a SCRAM extension we do not know")
        if not nonce.startswith(self._client_nonce) or len(nonce) == len(self._client_nonce):
            raise self._fail("the broker's SCRAM nonce does not extend ours")
        try:
            scram.check_nonce(nonce)
        except scram.ScramError as error:
            raise self._fail(f"the broker's SCRAM nonce is malformed ({error})") from None
        if iterations < mechanism.min_iterations:
            # A low count would make an eavesdropped proof cheap to brute-force.
            raise self._fail(f"the broker's SCRAM iteration count {iterations} is below {mechanism.min_iterations}")
        if iterations > mechanism.max_iterations:
            raise self._fail(f"the broker's SCRAM iteration count {iterations} is above {mechanism.max_iterations}")
        self._transition(SaslEvent.SERVER_FIRST)
        salted = scram.salted_password(mechanism, self._password.encode("utf-8"), salt, iterations)
        without_proof = f"c=biws,r={nonce}"  # biws: base64 of the GS2 header "n,,"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        proof = scram.client_proof(mechanism, salted, auth_message)
        self._expected_server_signature = scram.server_signature(mechanism, scram.server_key(mechanism, salted), auth_message)
        return f"{without_proof},p={scram.b64encode(proof)}".encode()

    def _verify_server_final(self, server_final_bytes: bytes) -> None:
        try:
            attributes = scram.parse_attributes(server_final_bytes.decode("utf-8"))
        except (UnicodeDecodeError, scram.ScramError):
            raise self._fail("malformed SCRAM server-final message") from None
        if "e" in attributes:
            raise self._fail(f"the broker refused: {attributes['e']}")
        try:
            signature = scram.b64decode(attributes["v"])
        except (KeyError, scram.ScramError):
            raise self._fail("the SCRAM server-final message has no server signature") from None
        if not hmac.compare_digest(signature, self._expected_server_signature):
            raise self._fail("the broker could not prove it holds the SCRAM credential (wrong server signature): refusing it")
