"""SASL on the Kafka listener (`--kafka-sasl`): one connection's exchange, as a state machine (pure).

Kafka's framing (KIP-152): the client sends SaslHandshake naming a mechanism, then its tokens in
SaslAuthenticate requests, each answered with the server's token, until the mechanism completes. A
SaslHandshake v0 client instead sends its tokens as bare frames (no request header), each answered
with a bare frame; `raw_tokens` tells the listener which framing follows. Mechanisms:

- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): `scramp` runs the server side from the
  user's stored credential (salt, iterations, stored key, server key); no password is stored, and
  the client proves it knows one without sending it.
- PLAIN (RFC 4616: `authzid NUL authcid NUL password`): the node derives the stored key from the
  password with the user's salt and iteration count (the user's SCRAM-SHA-256 credential, else its
  SCRAM-SHA-512 one) and compares it with `hmac.compare_digest`. A kq bearer token ("kq_<id>_<secret>")
  is also accepted as the password: the principal is then the token's user, whatever user name the
  client gave (a token authenticates its user by itself; Kafka clients have no other field for it).
  The authorization id, when given, must equal the principal's user, as Kafka requires.

Every failure, from an unknown user to a malformed message, is the same SaslError, answered
SASL_AUTHENTICATION_FAILED with one message, and the connection is then closed (Kafka does the same).
A user without a credential for the mechanism is answered as a known user with a wrong password
(`Security.scram_credential`'s stand-in): SCRAM sends a server-first message with a salt that is
the same on every node and every time, and fails at client-final; PLAIN derives a key as long.
Kafka fails an unknown SCRAM user at client-first and so lets user names be probed; kq does not.
PLAIN's derivation costs the user's iteration count of HMACs, so `authenticate` is run off the loop.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import scramp

from kq.broker.auth import Principal, Security
from kq.broker.config import KAFKA_SASL_MECHANISMS
from kq.broker.kafka.codes import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
)
from kq.client.security import scram_keys
from kq.proto.limits import KAFKA_SASL_ROUNDS_MAX, KAFKA_SASL_TOKEN_BYTES_MAX
from kq.raft.auth import SCRAM_MECHANISMS

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)  # Every mechanism kq serves, in Kafka's spelling.
assert MECHANISMS == KAFKA_SASL_MECHANISMS, "--kafka-sasl-mechanisms offers exactly these"


class SaslError(Exception):
    """A SASL exchange that cannot succeed; the message is sent to the client."""


class Mechanism(Protocol):
    """The server side of one mechanism for one connection."""

    principal: Principal | None  # Set when the exchange has succeeded.

    def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token; SaslError when the exchange fails."""
        ...


class PlainMechanism:
    """SASL PLAIN: one token, the password checked against the user's stored SCRAM key (or a token)."""

    def __init__(self, security: Security) -> None:
        self._security = security
        self.principal: Principal | None = None

    def step(self, token: bytes) -> bytes:
        """Verifies `authzid NUL authcid NUL password`; the answer is empty."""
        if self.principal is not None:
            raise SaslError("PLAIN takes one token")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslError("a PLAIN token is authzid NUL user NUL password")
        try:
            authzid, user, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError as error:
            raise SaslError("a PLAIN token is UTF-8") from error
        if not user or not password:  # Their length is bounded by the token's, KAFKA_SASL_TOKEN_BYTES_MAX.
            raise SaslError("PLAIN needs a user and a password")
        principal = self._security.token_principal(password) if password.startswith("kq_") else None
        if principal is None:
            principal = self._password_principal(user, password)
        if authzid and authzid != principal.user:
            raise SaslError("the authorization id must be empty or the authenticated user")
        self.principal = principal
        return b""

    def _password_principal(self, user: str, password: str) -> Principal:
        """The user's principal if `password` derives its stored key (SCRAM-SHA-256's credential, else
        SCRAM-SHA-512's). A user without either gets the same derivation against a stand-in
        (`Security.scram_credential`), so that it fails after as much work as a wrong password."""
        credential, known = self._security.scram_credential(user, SCRAM_SHA_256)
        if not known:
            other, other_known = self._security.scram_credential(user, SCRAM_SHA_512)
            if other_known:
                credential, known = other, True
        stored_key, _ = scram_keys(credential.mechanism, password, credential.salt, credential.iterations)
        if not hmac.compare_digest(stored_key, credential.stored_key) or not known:
            raise SaslError(f"invalid credentials with SASL mechanism {PLAIN}")
        return self._security.user_principal(user)


class ScramMechanism:
    """SASL SCRAM-SHA-256 or SCRAM-SHA-512: client-first, server-first, client-final, server-final."""

    def __init__(self, security: Security, mechanism: str) -> None:
        assert mechanism in SCRAM_MECHANISMS, mechanism
        self._security = security
        self._mechanism = mechanism
        self._server = scramp.ScramMechanism(mechanism).make_server(self._credential)
        self._user = ""  # Set when client-first names a user with a credential for the mechanism.
        self._round = 0
        self.principal: Principal | None = None

    def _credential(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's view of a user: (salt, stored key, server key, iterations); for a user without a
        credential for the mechanism, a stand-in (`Security.scram_credential`): the exchange then
        goes on to fail at client-final, as a wrong password does, not at client-first."""
        credential, known = self._security.scram_credential(user, self._mechanism)
        self._user = user if known else ""
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> bytes:
        """server-first for client-first, server-final for client-final."""
        self._round += 1
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SaslError("a SCRAM message is UTF-8") from error
        try:
            if self._round == 1:
                self._server.set_client_first(message)
                return str(self._server.get_server_first()).encode()
            if self._round == 2:
                self._server.set_client_final(message)
                answer = str(self._server.get_server_final()).encode()
            else:
                raise SaslError("SCRAM takes two client messages")
        except SaslError:
            raise
        except Exception as error:  # scramp raises ScramException, and other types on malformed input.
            raise SaslError(f"invalid credentials with SASL mechanism {self._mechanism}") from error
        if not self._user:  # A stand-in's proof cannot verify; never a principal from one.
            raise SaslError(f"invalid credentials with SASL mechanism {self._mechanism}")
        self.principal = self._security.user_principal(self._user)
        return answer


class SaslState(enum.Enum):
    """Where a connection's exchange is."""

    START = "start"  # No SaslHandshake yet.
    AUTHENTICATING = "authenticating"  # A mechanism is chosen; tokens follow.
    DONE = "done"  # Authenticated: `principal` is set.
    FAILED = "failed"  # The connection is closed after the response that says so.


@dataclass(frozen=True, slots=True)
class Answer:
    """What a SASL request is answered: a Kafka error code, a message, the server's token, and
    whether the connection closes after the response."""

    error_code: int
    message: str | None = None
    token: bytes = b""
    close: bool = False


class SaslSession:
    """One connection's SASL exchange (used by that connection's coroutine only, one call at a time)."""

    def __init__(self, security: Security, mechanisms: Sequence[str]) -> None:
        self._security = security
        self.mechanisms = tuple(mechanisms)
        self.state = SaslState.START
        self.raw_tokens = False  # SaslHandshake v0: the tokens come as bare frames.
        self.principal: Principal | None = None
        self._mechanism: Mechanism | None = None
        self._rounds = 0

    def handshake(self, mechanism: str, version: int) -> Answer:
        """SaslHandshake: chooses the mechanism (once per connection)."""
        if self.state is not SaslState.START:
            state, self.state = self.state, SaslState.FAILED
            return Answer(ILLEGAL_SASL_STATE, f"SaslHandshake in state {state.value}", close=True)
        if mechanism not in self.mechanisms:
            self.state = SaslState.FAILED
            return Answer(
                UNSUPPORTED_SASL_MECHANISM,
                f"{mechanism[:40]!r} is not enabled: {', '.join(self.mechanisms)}",
                close=True,
            )
        self._mechanism = (
            PlainMechanism(self._security)
            if mechanism == PLAIN
            else ScramMechanism(self._security, mechanism)
        )
        self.state = SaslState.AUTHENTICATING
        self.raw_tokens = version == 0
        return Answer(NONE)

    def authenticate(self, token: bytes) -> Answer:
        """SaslAuthenticate (or a bare token after a v0 handshake): the mechanism's next step."""
        if self.state is not SaslState.AUTHENTICATING or self._mechanism is None:
            self.state = SaslState.FAILED
            return Answer(ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake", close=True)
        self._rounds += 1
        try:
            if self._rounds > KAFKA_SASL_ROUNDS_MAX:
                raise SaslError(f"more than {KAFKA_SASL_ROUNDS_MAX} SASL tokens")
            if len(token) > KAFKA_SASL_TOKEN_BYTES_MAX:
                raise SaslError(f"a SASL token is at most {KAFKA_SASL_TOKEN_BYTES_MAX} bytes")
            answer = self._mechanism.step(token)
        except SaslError as failure:
            self.state = SaslState.FAILED
            return Answer(SASL_AUTHENTICATION_FAILED, f"Authentication failed: {failure}", close=True)
        if self._mechanism.principal is not None:
            self.principal = self._mechanism.principal
            self.state = SaslState.DONE
        return Answer(NONE, token=answer)
