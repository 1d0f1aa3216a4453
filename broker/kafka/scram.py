"""Kafka's DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554) over kq's users.

kq's users are SCRAM credentials replicated in group 0 (raft/auth.py); these APIs read them from group
0's view (this process's, or group 0's leader's ListUsers from another group's process) and change
them with one AlterScram command on group 0's leader (forwarded there from any node), so concurrent
changes of different mechanisms never lose one another. The client sends
the salted password (Hi(password, salt, iterations)); the edge derives the stored and server keys
from it, so neither the password nor the salted password is proposed or stored.

Errors as Kafka answers them: an unknown mechanism is UNSUPPORTED_SASL_MECHANISM; iterations outside
Kafka's 4096..16384, an empty name or salt (and a name or salt kq cannot keep: raft/auth.py) are
UNACCEPTABLE_CREDENTIAL; a user named twice is DUPLICATE_RESOURCE; describing a user, or deleting a
credential, that does not exist is RESOURCE_NOT_FOUND. Describing needs DESCRIBE on the cluster
(the response's top-level error, and each named user's), altering ALTER on it (each user's result says
CLUSTER_AUTHORIZATION_FAILED). Deleting a user's last credential deletes the user, and its tokens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kq.broker.auth import CLUSTER
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import CLUSTER_AUTHORIZATION_FAILED, DENIED_MESSAGE, ApiKey
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import NONE, NOT_CONTROLLER, UNSUPPORTED_SASL_MECHANISM
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode, spec_of
from kq.proto.limits import KAFKA_SCRAM_ITERATIONS_MAX, KAFKA_SCRAM_ITERATIONS_MIN, SCRAM_ALTERATIONS_MAX
from kq.raft.auth import CLUSTER_RESOURCE, credentials_problem, keys_of_salted_password, user_name_problem

DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL = 91, 92, 93
MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism codes.
MECHANISM_CODES = {name: code for code, name in MECHANISMS.items()}

Outcome = tuple[int, str | None]


def upsertion_problem(upsertion: Any) -> Outcome | None:
    """(Kafka code, message) refusing an upsertion, Kafka's checks first, then kq's; None: keep it."""
    if not upsertion.name:
        return UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if upsertion.mechanism not in MECHANISMS:
        return UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    if upsertion.iterations < KAFKA_SCRAM_ITERATIONS_MIN:
        return UNACCEPTABLE_CREDENTIAL, f"Too few iterations: at least {KAFKA_SCRAM_ITERATIONS_MIN}"
    if upsertion.iterations > KAFKA_SCRAM_ITERATIONS_MAX:
        return UNACCEPTABLE_CREDENTIAL, f"Too many iterations: at most {KAFKA_SCRAM_ITERATIONS_MAX}"
    if not upsertion.salt:
        return UNACCEPTABLE_CREDENTIAL, "Salt must not be empty"
    if not upsertion.salted_password:
        return UNACCEPTABLE_CREDENTIAL, "Password must not be empty"
    problem = user_name_problem(upsertion.name) or credentials_problem([credential_of(upsertion)])
    return None if problem is None else (UNACCEPTABLE_CREDENTIAL, problem)


def credential_of(upsertion: Any) -> kq_pb2.ScramCredential:
    """The credential an upsertion states (its mechanism known), keys derived from the salted password."""
    mechanism = MECHANISMS[upsertion.mechanism]
    stored_key, server_key = keys_of_salted_password(mechanism, bytes(upsertion.salted_password))
    return kq_pb2.ScramCredential(
        mechanism=mechanism,
        salt=bytes(upsertion.salt),
        stored_key=stored_key,
        server_key=server_key,
        iterations=upsertion.iterations,
    )


def deletion_problem(deletion: Any) -> Outcome | None:
    """(Kafka code, message) refusing a deletion; None: propose it."""
    if not deletion.name:
        return UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if deletion.mechanism not in MECHANISMS:
        return UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    if user_name_problem(deletion.name) is not None:  # No such user can exist in kq.
        return RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
    return None


class ScramApis(KafkaBase):
    """DescribeUserScramCredentials and AlterUserScramCredentials."""

    async def describe_user_scram_credentials(self, request: Request, connection: Connection) -> Any:
        """Each named user's mechanisms and iterations (null or empty: every user's); without DESCRIBE
        on the cluster, the top-level error and each named user's, as Kafka's getErrorResponse."""
        module = response_module(DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version)
        named = [user.name for user in request.body.users or ()]
        results = []
        if not self._permitted(connection, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, CLUSTER, CLUSTER_RESOURCE):
            code, message = CLUSTER_AUTHORIZATION_FAILED, DENIED_MESSAGE[CLUSTER]
            denied = tuple(_described(module, name, code, message, ()) for name in named)
            return build(
                module.DescribeUserScramCredentialsResponse,
                error_code=code,
                error_message=message,
                results=denied,
            )
        try:
            _, users = await self._security_view()
        except KqError as error:
            code = kafka_code(error, NOT_CONTROLLER)
            return build(
                module.DescribeUserScramCredentialsResponse, error_code=code, error_message=str(error)
            )
        if not named:
            named = sorted(users)
        counts = Counter(named)
        for name in dict.fromkeys(named):  # Each user once, in the request's order.
            if counts[name] > 1:
                message = "Cannot describe SCRAM credentials for the same user twice in a single request"
                results.append(_described(module, name, DUPLICATE_RESOURCE, message, ()))
                continue
            credentials = users.get(name)
            if credentials is None:
                message = "Attempt to describe a user credential that does not exist"
                results.append(_described(module, name, RESOURCE_NOT_FOUND, message, ()))
                continue
            infos = tuple(
                build(module.CredentialInfo, mechanism=MECHANISM_CODES[mechanism], iterations=iterations)
                for mechanism, iterations in credentials
                if mechanism in MECHANISM_CODES
            )
            results.append(_described(module, name, NONE, None, infos))
        return build(module.DescribeUserScramCredentialsResponse, error_code=NONE, results=tuple(results))

    async def alter_user_scram_credentials(self, request: Request, connection: Connection) -> Any:
        """Each user's one change (ALTER on the cluster); one result per user named."""
        module = response_module(ALTER_USER_SCRAM_CREDENTIALS, request.api_version)
        body = request.body
        names = [change.name for change in (*body.upsertions, *body.deletions)]
        order = list(dict.fromkeys(names))
        if not self._permitted(connection, ApiKey.ALTER_USER_SCRAM_CREDENTIALS, CLUSTER, CLUSTER_RESOURCE):
            denied: Outcome = (CLUSTER_AUTHORIZATION_FAILED, None)
            return _altered(module, dict.fromkeys(order, denied), order)
        outcomes = self._checked(names, body)
        upsertions = [
            kq_pb2.ScramUpsertion(user=u.name, credential=credential_of(u))
            for u in body.upsertions
            if u.name not in outcomes
        ]
        deletions = [
            kq_pb2.ScramDeletion(user=d.name, mechanism=MECHANISMS[d.mechanism])
            for d in body.deletions
            if d.name not in outcomes
        ]
        changes: list[kq_pb2.ScramUpsertion | kq_pb2.ScramDeletion] = [*upsertions, *deletions]
        for start in range(0, len(changes), SCRAM_ALTERATIONS_MAX):
            part = changes[start : start + SCRAM_ALTERATIONS_MAX]
            outcomes.update(
                await self._alter_scram(
                    [change for change in part if isinstance(change, kq_pb2.ScramUpsertion)],
                    [change for change in part if isinstance(change, kq_pb2.ScramDeletion)],
                )
            )
        return _altered(module, outcomes, order)

    def _checked(self, names: list[str], body: Any) -> dict[str, Outcome]:
        """The users refused before anything is proposed: named twice, or a change Kafka (or kq) refuses."""
        counts = Counter(names)
        outcomes: dict[str, Outcome] = {}
        for name, count in counts.items():
            if count > 1:
                message = "A user credential cannot be altered twice in the same request"
                outcomes[name] = (DUPLICATE_RESOURCE, message)
        for upsertion in body.upsertions:
            problem = None if upsertion.name in outcomes else upsertion_problem(upsertion)
            if problem is not None:
                outcomes[upsertion.name] = problem
        for deletion in body.deletions:
            problem = None if deletion.name in outcomes else deletion_problem(deletion)
            if problem is not None:
                outcomes[deletion.name] = problem
        return outcomes

    async def _alter_scram(
        self, upsertions: list[kq_pb2.ScramUpsertion], deletions: list[kq_pb2.ScramDeletion]
    ) -> dict[str, Outcome]:
        """One AlterScram on group 0's leader; each user's (Kafka code, message)."""
        users = [u.user for u in upsertions] + [d.user for d in deletions]
        if not users:
            return {}
        request = kq_pb2.AlterScramCredentialsRequest(upsertions=upsertions, deletions=deletions)
        try:
            response = await self._on_leader("AlterScramCredentials", request)
        except KqError as error:
            failed: Outcome = (kafka_code(error, NOT_CONTROLLER), str(error))
            return dict.fromkeys(users, failed)
        await self._security_seen(response.index)
        outcomes: dict[str, Outcome] = {}
        for result in response.results:
            code = ErrorCode(result.error_code)
            if code == ErrorCode.OK:
                outcomes[result.user] = (NONE, None)
            elif code == ErrorCode.UNKNOWN_USER:
                message = "Attempt to delete a user credential that does not exist"
                outcomes[result.user] = (RESOURCE_NOT_FOUND, message)
            else:
                outcomes[result.user] = (spec_of(code).kafka_code, spec_of(code).meaning)
        return outcomes


def _described(module: Any, name: str, code: int, message: str | None, infos: tuple[Any, ...]) -> Any:
    return build(
        module.DescribeUserScramCredentialsResult,
        user=name,
        error_code=code,
        error_message=message,
        credential_infos=infos,
    )


def _altered(module: Any, outcomes: dict[str, Outcome], order: list[str]) -> Any:
    results = tuple(
        build(
            module.AlterUserScramCredentialsResult,
            user=name,
            error_code=outcomes.get(name, (NONE, None))[0],
            error_message=outcomes.get(name, (NONE, None))[1],
        )
        for name in order
    )
    return build(module.AlterUserScramCredentialsResponse, results=results)
