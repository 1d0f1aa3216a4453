"""The Broker RPCs that manage users, tokens and ACLs (raft/auth.py), and WhoAmI.

Writes run on the leader, like every proposal; reads answer from this node's view (broker/auth.py).
What each needs of the caller's ACLs is broker/auth.py `REQUIREMENTS`, checked at the edge before
the handler runs. A token's secret is drawn here, at the edge, and only its SHA-256 is proposed, so
the Raft log, the stores and their copies never hold a usable token.
"""

from __future__ import annotations

import secrets

import grpc

from kq.broker.auth import TOKEN_PREFIX, Security, current_principal, token_secret_hash
from kq.broker.errors import InvalidArgumentError, error_for_code
from kq.broker.proposals import propose_and_wait, wall_clock_ms
from kq.broker.service_base import ServiceBase
from kq.broker.validation import check
from kq.proto import kq_pb2
from kq.proto.limits import PROPOSAL_TIMEOUT_S, TOKEN_SECRET_BYTES, TOKEN_TTL_S_MAX
from kq.raft import commands
from kq.raft.auth import AuthResult, user_name_problem
from kq.raft.placement import METADATA_GROUP
from kq.raft.results import ApplyResult


class SecurityRpcs(ServiceBase):
    """PutUser .. ListAcls and WhoAmI, mixed into BrokerService."""

    _security: Security

    def _propose_auth(self, command: kq_pb2.Command, subject: str) -> AuthResult:
        self._require_leader(METADATA_GROUP)  # Users, tokens and ACLs are the cluster's state.
        result: ApplyResult = propose_and_wait(self._consensus, command, PROPOSAL_TIMEOUT_S)
        assert isinstance(result, AuthResult)
        error = error_for_code(result.error, subject)
        if error is not None:
            raise error
        return result

    def PutUser(
        self, request: kq_pb2.PutUserRequest, context: grpc.ServicerContext
    ) -> kq_pb2.PutUserResponse:
        """Creates a user, or replaces its SCRAM credentials (computed by the client from the password)."""
        result = self._propose_auth(commands.put_user(request.name, request.credentials), request.name)
        return kq_pb2.PutUserResponse(index=self._store.applied_index(), created=result.created)

    def AlterScramCredentials(
        self, request: kq_pb2.AlterScramCredentialsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.AlterScramCredentialsResponse:
        """Sets or removes one SCRAM mechanism's credential per user (Kafka's AlterUserScramCredentials);
        each user's outcome is in the answer, not an error of the call."""
        result = self._propose_auth(commands.alter_scram(request.upsertions, request.deletions), "SCRAM")
        return kq_pb2.AlterScramCredentialsResponse(
            index=self._store.applied_index(),
            results=[kq_pb2.ScramUserResult(user=user, error_code=code) for user, code in result.users],
        )

    def DeleteUser(
        self, request: kq_pb2.DeleteUserRequest, context: grpc.ServicerContext
    ) -> kq_pb2.DeleteUserResponse:
        """Deletes a user and its tokens."""
        self._propose_auth(commands.delete_user(request.name), request.name)
        return kq_pb2.DeleteUserResponse(index=self._store.applied_index())

    def ListUsers(
        self, request: kq_pb2.ListUsersRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ListUsersResponse:
        """The users this node knows, by name, with their mechanisms and how many tokens each holds."""
        state = self._security.state
        tokens: dict[str, int] = {}
        for token in state.tokens.values():
            tokens[token.user] = tokens.get(token.user, 0) + 1
        return kq_pb2.ListUsersResponse(
            users=[
                kq_pb2.UserInfo(
                    name=name,
                    mechanisms=[credential.mechanism for credential in user.credentials],
                    tokens=tokens.get(name, 0),
                    iterations=[credential.iterations for credential in user.credentials],
                )
                for name, user in sorted(state.users.items())
            ]
        )

    def CreateToken(
        self, request: kq_pb2.CreateTokenRequest, context: grpc.ServicerContext
    ) -> kq_pb2.CreateTokenResponse:
        """Creates a bearer token for a user; its secret is in this answer only."""
        user = request.user or current_principal().user
        check(user_name_problem(user))
        if request.ttl_s > TOKEN_TTL_S_MAX:
            raise InvalidArgumentError(f"a token lives at most {TOKEN_TTL_S_MAX} s")
        created_ms = wall_clock_ms()
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(TOKEN_SECRET_BYTES)
        token = kq_pb2.Token(
            token_id=token_id,
            user=user,
            secret_sha256=token_secret_hash(secret),
            created_ms=created_ms,
            expires_ms=created_ms + request.ttl_s * 1000 if request.ttl_s else 0,
            description=request.description,
        )
        self._propose_auth(commands.put_token(token), user)
        return kq_pb2.CreateTokenResponse(
            token=f"{TOKEN_PREFIX}{token_id}_{secret}",
            token_id=token_id,
            expires_ms=token.expires_ms,
            index=self._store.applied_index(),
        )

    def RevokeToken(
        self, request: kq_pb2.RevokeTokenRequest, context: grpc.ServicerContext
    ) -> kq_pb2.RevokeTokenResponse:
        """Deletes a token: calls presenting it are refused from the entry's commit on, on every node."""
        self._propose_auth(commands.delete_token(request.token_id), request.token_id)
        return kq_pb2.RevokeTokenResponse(index=self._store.applied_index())

    def ListTokens(
        self, request: kq_pb2.ListTokensRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ListTokensResponse:
        """Tokens (never their secrets), by user then id; of one user when `user` is given."""
        tokens = sorted(self._security.state.tokens.values(), key=lambda token: (token.user, token.token_id))
        return kq_pb2.ListTokensResponse(
            tokens=[
                kq_pb2.TokenInfo(
                    token_id=token.token_id,
                    user=token.user,
                    created_ms=token.created_ms,
                    expires_ms=token.expires_ms,
                    description=token.description,
                )
                for token in tokens
                if not request.user or token.user == request.user
            ]
        )

    def AddAcls(
        self, request: kq_pb2.AddAclsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.AddAclsResponse:
        """Adds ACLs (one already there stays once)."""
        self._propose_auth(commands.add_acls(request.acls), "ACLs")
        return kq_pb2.AddAclsResponse(index=self._store.applied_index())

    def RemoveAcls(
        self, request: kq_pb2.RemoveAclsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.RemoveAclsResponse:
        """Removes the ACLs equal to those given; answers how many were there."""
        result = self._propose_auth(commands.remove_acls(request.acls), "ACLs")
        return kq_pb2.RemoveAclsResponse(index=self._store.applied_index(), removed=result.removed)

    def ListAcls(
        self, request: kq_pb2.ListAclsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ListAclsResponse:
        """The ACLs this node knows (of one principal when `principal` is given)."""
        return kq_pb2.ListAclsResponse(
            acls=[
                acl
                for acl in self._security.state.acls
                if not request.principal or acl.principal == request.principal
            ]
        )

    def WhoAmI(self, request: kq_pb2.WhoAmIRequest, context: grpc.ServicerContext) -> kq_pb2.WhoAmIResponse:
        """The caller's principal as this node sees it."""
        principal = current_principal()
        return kq_pb2.WhoAmIResponse(principal=principal.name, super_user=principal.super_user)
