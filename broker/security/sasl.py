"""SASL authentication of one connection, sans-I/O: requests in, answers out.

Everything that decides whether a connection on a SASL listener has
authenticated lives here; this file knows no sockets. ``broker.server``
hands every request of such a connection to ``SaslServer.receive`` first: it
answers SaslHandshake and SaslAuthenticate itself, returns None for a request
the dispatcher may serve, and raises ``SaslRefusal`` for one that must close
the connection. The exchange follows Kafka:

    ApiVersions*  SaslHandshake(mechanism)  SaslAuthenticate(token)+   then any request
    ... later, before the session's lifetime ends (KIP-368):
    SaslHandshake(same mechanism)  SaslAuthenticate(token)+   (same principal)

Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate
are served; anything else closes the connection, as Kafka does. A failed
exchange is answered (SASL_AUTHENTICATION_FAILED with a message that does
not say whether the user exists) and then the connection is closed. With
``connections.max.reauth.ms`` set, a successful SaslAuthenticate v1+ carries
``session_lifetime_ms``; once that has passed, any request other than a new
handshake closes the connection, and a re-authentication must prove the same
principal.

After a v0 SaslHandshake the tokens arrive as bare frames without request
headers (clients from before Kafka 1.0); ``broker.server`` unwraps them and
hands them in as SaslAuthenticate v0 bodies: this machine is the same.

The states and the events that move between them are one table
(``TRANSITIONS``); ``ALLOWED`` says which requests each state lets through.
The mechanisms are exchanges with one ``step(token) -> challenge`` method:
PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802/7677, the arithmetic in
``protocol.scram``; no channel binding: the client's gs2 header is ``n,,``
or ``n,a=USER,`` with its own name, as Kafka allows, and its ``c=``
attribute the base64 of that header).
"""

from __future__ import annotations

import enum

import attrs

from broker.security.session import KafkaPrincipal
from protocol import scram, state_machine
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.state_machine import IllegalTransition


class SaslState(enum.Enum):
    AWAIT_HANDSHAKE = "awaiting SaslHandshake"
    AWAIT_TOKEN = "awaiting SaslAuthenticate"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class SaslEvent(enum.Enum):
    HANDSHAKE_ACCEPTED = "handshake accepted"
    HANDSHAKE_REFUSED = "handshake refused"
    TOKEN_CHALLENGED = "token answered with a challenge"
    TOKEN_ACCEPTED = "token accepted"
    TOKEN_REFUSED = "token refused"


S, E = SaslState, SaslEvent
TRANSITIONS: dict[tuple[SaslState, SaslEvent], SaslState] = {
    (S.AWAIT_HANDSHAKE, E.HANDSHAKE_ACCEPTED): S.AWAIT_TOKEN,
    (S.AWAIT_HANDSHAKE, E.HANDSHAKE_REFUSED): S.FAILED,
    (S.AWAIT_TOKEN, E.TOKEN_CHALLENGED): S.AWAIT_TOKEN,
    (S.AWAIT_TOKEN, E.TOKEN_ACCEPTED): S.AUTHENTICATED,
    (S.AWAIT_TOKEN, E.TOKEN_REFUSED): S.FAILED,
    # KIP-368: an authenticated connection starts over to re-authenticate.
    (S.AUTHENTICATED, E.HANDSHAKE_ACCEPTED): S.AWAIT_TOKEN,
    (S.AUTHENTICATED, E.HANDSHAKE_REFUSED): S.FAILED,
}
del S, E

# Requests each state lets in (None: every request, to the dispatcher).
ALLOWED: dict[SaslState, frozenset | None] = {
    SaslState.AWAIT_HANDSHAKE: frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE}),
    SaslState.AWAIT_TOKEN: frozenset({ApiKey.SASL_AUTHENTICATE}),
    SaslState.AUTHENTICATED: None,
    SaslState.FAILED: frozenset(),
}


class SaslRefusal(Exception):
    """The connection must be closed without an answer (the reason is the message)."""


class AuthenticationFailed(Exception):
    """The mechanism refuses the client; the message goes back to it."""


class IllegalSaslTransition(SaslRefusal, IllegalTransition):
    """A SASL step the table does not allow: the connection is closed."""

    def __init__(self, state: SaslState, event: SaslEvent):
        IllegalTransition.__init__(self, state, event)


def transition(state: SaslState, event: SaslEvent) -> SaslState:
    """The state after ``event`` in ``state``; raises IllegalSaslTransition (a SaslRefusal) if illegal."""
    return state_machine.transition(TRANSITIONS, state, event, IllegalSaslTransition)


@attrs.frozen
class SaslReply:
    """The body answering a SaslHandshake or SaslAuthenticate; ``close``: send
    it, then close the connection."""

    body: dict
    close: bool = False


# -- mechanisms -------------------------------------------------------------------


@attrs.define(eq=False)
class PlainExchange:
    """RFC 4616: one token ``authzid NUL authcid NUL password``."""

    _credentials: object
    username: str | None = attrs.field(default=None, init=False)

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = bytes(token).split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Authentication failed: PLAIN wants authzid NUL username NUL password")
        try:
            authzid, username, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Authentication failed: PLAIN credentials are not UTF-8") from None
        if not username or not password:
            raise AuthenticationFailed("Authentication failed: username or password is empty")
        if authzid and authzid != username:
            raise AuthenticationFailed("Authentication failed: client requested an authorization id that is different from username")
        if not self._credentials.verify_plain(username, password):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.username = username
        return b"", True


@attrs.define(eq=False)
class ScramExchange:
    """The server's half of RFC 5802: client-first -> server-first,
    client-final -> server-final."""

    mechanism: scram.ScramMechanism
    _credentials: object
    username: str | None = attrs.field(default=None, init=False)
    _expect_final: bool = attrs.field(default=False, init=False)
    _client_first_bare: str = attrs.field(default="", init=False)
    _channel_binding: str = attrs.field(default="", init=False)  # what c= must be: base64 of the gs2 header ("biws" for "n,,")
    _server_first: str = attrs.field(default="", init=False)
    _nonce: str = attrs.field(default="", init=False)
    _credential: scram.ScramCredential | None = attrs.field(default=None, init=False)
    _known: bool = attrs.field(default=False, init=False)  # the name has a credential (else the proof cannot pass)
    _name: str = attrs.field(default="", init=False)

    def _refuse(self) -> AuthenticationFailed:
        return AuthenticationFailed(
            f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self.mechanism.name}"
        )

    def step(self, token: bytes) -> tuple[bytes, bool]:
        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed(f"Authentication failed: {self.mechanism.name} message is not UTF-8") from None
        try:
            if not self._expect_final:
                return self._client_first(text), False
            return self._client_final(text), True
        except scram.ScramError as error:
            raise AuthenticationFailed(f"Authentication failed: invalid {self.mechanism.name} message: {error}") from None

    def _client_first(self, text: str) -> bytes:
        if not text.startswith("n,"):
            raise scram.ScramError("channel binding is not supported (the gs2 header must be 'n,,' )")
        _flag, _, rest = text.partition(",")
        authzid, separator, bare = rest.partition(",")
        if not separator:
            raise scram.ScramError("client-first-message has no gs2 header")
        if authzid and not authzid.startswith("a="):
            raise scram.ScramError("the gs2 header's authorization id must read a=NAME")
        attributes = scram.parse_attributes(bare)
        if list(attributes)[:2] != ["n", "r"]:
            raise scram.ScramError("client-first-message must start with n= then r=")
        if set(attributes) - {"n", "r"}:
            raise scram.ScramError(f"unsupported SCRAM extensions {sorted(set(attributes) - {'n', 'r'})}")
        name = scram.unescape_username(attributes["n"])
        client_nonce = attributes["r"]
        if not name:
            raise scram.ScramError("empty user name")
        if authzid and scram.unescape_username(authzid[2:]) != name:
            # As Kafka: an authorization id may only name the user itself.
            raise scram.ScramError("client requested an authorization id that is different from username")
        scram.check_nonce(client_nonce)
        credential = self._credentials.scram_credential(name, self.mechanism)
        self._known = credential is not None
        if credential is None:
            # The same shape of answer as for a real user, so the exchange does
            # not tell who exists; the proof can never match.
            credential = self._credentials.fake_scram_credential(name, self.mechanism)
        self._credential = credential
        self._name = name
        self._nonce = client_nonce + scram.new_nonce()
        self._client_first_bare = bare
        self._channel_binding = scram.b64encode(text[: len(text) - len(bare)].encode("utf-8"))
        self._server_first = f"r={self._nonce},s={scram.b64encode(credential.salt)},i={credential.iterations}"
        self._expect_final = True
        return self._server_first.encode("utf-8")

    def _client_final(self, text: str) -> bytes:
        without_proof, separator, proof_text = text.rpartition(",p=")
        if not separator:
            raise scram.ScramError("client-final-message has no proof")
        attributes = scram.parse_attributes(without_proof)
        if list(attributes) != ["c", "r"]:
            raise scram.ScramError("client-final-message must be c=, r=, p=")
        if attributes["c"] != self._channel_binding:
            raise scram.ScramError("c= must be the base64 of the client-first message's gs2 header (no channel binding)")
        if attributes["r"] != self._nonce:
            raise self._refuse()
        proof = scram.b64decode(proof_text)
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        matched = scram.verify_client_proof(self.mechanism, credential, auth_message, proof)
        if not (matched and self._known):
            raise self._refuse()
        self.username = self._name
        signature = scram.server_signature(self.mechanism, credential.server_key, auth_message)
        return f"v={scram.b64encode(signature)}".encode()


# -- the connection's machine -------------------------------------------------------


@attrs.define(eq=False)
class SaslServer:
    """One connection's authentication. ``credentials`` offers
    ``scram_credential(name, mechanism)``, ``fake_scram_credential(name, mechanism)`` and
    ``verify_plain(name, password)`` (``broker.security.credentials``);
    ``reauth_ms`` is ``connections.max.reauth.ms`` (0: sessions never end)."""

    mechanisms: tuple[str, ...] = attrs.field(converter=tuple, kw_only=True)
    _credentials: object = attrs.field(kw_only=True)
    _reauth_ms: int = attrs.field(default=0, kw_only=True)
    state: SaslState = attrs.field(default=SaslState.AWAIT_HANDSHAKE, init=False)
    principal: KafkaPrincipal | None = attrs.field(default=None, init=False)
    mechanism: str | None = attrs.field(default=None, init=False)
    expires_at_ms: int | None = attrs.field(default=None, init=False)
    _exchange: PlainExchange | ScramExchange | None = attrs.field(default=None, init=False)

    def _move(self, event: SaslEvent) -> None:
        self.state = transition(self.state, event)

    def receive(self, api_key: int, api_version: int, body: dict, now_ms: int) -> SaslReply | None:
        """Answer a SASL request, let another through (None), or refuse."""
        allowed = ALLOWED[self.state]
        if allowed is not None and api_key not in allowed:
            name = ApiKey(api_key).name if api_key in ApiKey._value2member_map_ else str(api_key)
            during = self.state.value
            self.state = SaslState.FAILED
            raise SaslRefusal(f"unexpected {name} request while {during}")
        if api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(body)
        if api_key == ApiKey.SASL_AUTHENTICATE:
            return self._authenticate(api_version, body, now_ms)
        if self.expires_at_ms is not None and now_ms >= self.expires_at_ms and api_key != ApiKey.API_VERSIONS:
            self.state = SaslState.FAILED
            raise SaslRefusal("the session's lifetime (connections.max.reauth.ms) has passed without re-authentication")
        return None

    def _handshake(self, body: dict) -> SaslReply:
        requested = body.get("mechanism") or ""
        mechanism = requested.upper()
        if mechanism not in self.mechanisms:
            self._move(SaslEvent.HANDSHAKE_REFUSED)
            return SaslReply({"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(self.mechanisms)}, close=True)
        if self.principal is not None and mechanism != self.mechanism:
            # KIP-368: re-authentication keeps the mechanism.
            self._move(SaslEvent.HANDSHAKE_REFUSED)
            return SaslReply({"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": [self.mechanism]}, close=True)
        self._move(SaslEvent.HANDSHAKE_ACCEPTED)
        self.mechanism = mechanism
        if mechanism == "PLAIN":
            self._exchange = PlainExchange(self._credentials)
        else:
            self._exchange = ScramExchange(scram.MECHANISMS[mechanism], self._credentials)
        return SaslReply({"error_code": ErrorCode.NONE, "mechanisms": list(self.mechanisms)})

    def _authenticate(self, version: int, body: dict, now_ms: int) -> SaslReply:
        if self.state is SaslState.AUTHENTICATED:
            # No handshake reopened the exchange: Kafka answers this and
            # keeps the session as it was.
            message = "SaslAuthenticate request received after successful authentication"
            return SaslReply({"error_code": ErrorCode.ILLEGAL_SASL_STATE, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0})
        token = body.get("auth_bytes") or b""
        try:
            challenge, done = self._exchange.step(token)
        except AuthenticationFailed as error:
            self._move(SaslEvent.TOKEN_REFUSED)
            self._exchange = None
            return self._failure(str(error))
        if not done:
            self._move(SaslEvent.TOKEN_CHALLENGED)
            return SaslReply({"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": challenge, "session_lifetime_ms": 0})
        principal = KafkaPrincipal("User", self._exchange.username)
        self._exchange = None
        if self.principal is not None and principal != self.principal:
            self._move(SaslEvent.TOKEN_REFUSED)
            return self._failure(f"Cannot change principals during re-authentication from {self.principal}: {principal}")
        self._move(SaslEvent.TOKEN_ACCEPTED)
        self.principal = principal
        lifetime = self._reauth_ms
        self.expires_at_ms = now_ms + lifetime if lifetime else None
        return SaslReply({"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": challenge, "session_lifetime_ms": lifetime})

    @staticmethod
    def _failure(message: str) -> SaslReply:
        body = {"error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0}
        return SaslReply(body, close=True)
