"""Kafka's ACL APIs over kq's ACL model: DescribeAcls, CreateAcls and DeleteAcls.

kq keeps ACLs in group 0 (raft/auth.py: principal, resource type and name, literal or prefixed,
operation, allow or deny); these handlers translate Kafka's bindings to those rows and back. The
mapping is exact both ways, and what kq cannot represent is refused, never widened:

- resource types TOPIC, GROUP, CLUSTER (Kafka's "kafka-cluster" is kq's "kq-cluster") and
  TRANSACTIONAL_ID; kq has no DELEGATION_TOKEN or USER resources, so an ACL on one answers
  INVALID_REQUEST;
- patterns LITERAL (with "*" for every name) and PREFIXED; ANY and MATCH only in filters;
- operations ALL, READ, WRITE, CREATE, DELETE, ALTER and DESCRIBE; Kafka's others (CLUSTER_ACTION,
  DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS) are refused;
- ALLOW and DENY; every kq ACL applies to every host, so a creation must name host "*".

A creation Kafka itself would refuse (an UNKNOWN or ANY enum, an empty name, a cluster resource not
named "kafka-cluster", a principal without a type) answers INVALID_REQUEST as Kafka does, and so do
those kq cannot keep, each with its reason. Filters follow Kafka's ResourcePatternFilter and
AccessControlEntryFilter: a filter with an UNKNOWN enum is INVALID_REQUEST; one that names something kq
cannot hold simply matches nothing.

DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls ALTER on it
(CLUSTER_AUTHORIZATION_FAILED otherwise), as Kafka documents. Reads answer from group 0's view: this
process's in group 0's processes, group 0's leader's (ListAcls) from another group's process, whose
store holds no security rows. Writes are AddAcls and RemoveAcls on group 0's leader (forwarded there
from any node), at most ACLS_PER_REQUEST_MAX ACLs per proposal, answered once this process's view
holds them when it is one of group 0's (read-your-writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kq.broker.auth import CLUSTER
from kq.broker.errors import KqError
from kq.broker.kafka.authorize import CLUSTER_AUTHORIZATION_FAILED, ApiKey
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.codes import INVALID_REQUEST, NONE, NOT_CONTROLLER
from kq.broker.kafka.framing import Request
from kq.broker.kafka.listener import Connection
from kq.proto import kq_pb2
from kq.proto.limits import ACLS_PER_REQUEST_MAX
from kq.raft.auth import CLUSTER_RESOURCE, acl_problem

KAFKA_CLUSTER_NAME = "kafka-cluster"  # The name of Kafka's one cluster resource.
ANY_HOST = "*"

# Kafka's enums (org.apache.kafka.common.resource / acl), by their wire codes.
UNKNOWN, ANY = 0, 1
MATCH = 2  # PatternType.MATCH: filters only.
RESOURCE_TYPES = {
    2: kq_pb2.ACL_RESOURCE_TOPIC,
    3: kq_pb2.ACL_RESOURCE_GROUP,
    4: kq_pb2.ACL_RESOURCE_CLUSTER,
    5: kq_pb2.ACL_RESOURCE_TRANSACTIONAL_ID,
}
KAFKA_RESOURCE_NAMES = {6: "DELEGATION_TOKEN", 7: "USER"}  # Kafka's, not kq's.
PATTERN_KAFKA_LITERAL = 3
PATTERN_TYPES = {PATTERN_KAFKA_LITERAL: kq_pb2.ACL_PATTERN_LITERAL, 4: kq_pb2.ACL_PATTERN_PREFIXED}
OPERATIONS = {
    2: kq_pb2.ACL_OPERATION_ALL,
    3: kq_pb2.ACL_OPERATION_READ,
    4: kq_pb2.ACL_OPERATION_WRITE,
    5: kq_pb2.ACL_OPERATION_CREATE,
    6: kq_pb2.ACL_OPERATION_DELETE,
    7: kq_pb2.ACL_OPERATION_ALTER,
    8: kq_pb2.ACL_OPERATION_DESCRIBE,
}
KAFKA_OPERATION_NAMES = {
    9: "CLUSTER_ACTION",
    10: "DESCRIBE_CONFIGS",
    11: "ALTER_CONFIGS",
    12: "IDEMPOTENT_WRITE",
    13: "CREATE_TOKENS",
    14: "DESCRIBE_TOKENS",
}
PERMISSIONS = {2: kq_pb2.ACL_PERMISSION_DENY, 3: kq_pb2.ACL_PERMISSION_ALLOW}
_KAFKA_OF: dict[str, dict[int, int]] = {
    "resource": {kq: kafka for kafka, kq in RESOURCE_TYPES.items()},
    "pattern": {kq: kafka for kafka, kq in PATTERN_TYPES.items()},
    "operation": {kq: kafka for kafka, kq in OPERATIONS.items()},
    "permission": {kq: kafka for kafka, kq in PERMISSIONS.items()},
}
# The largest wire code of each Kafka enum: a larger one is UNKNOWN to Kafka too.
_RESOURCE_TYPE_MAX, _PATTERN_TYPE_MAX, _OPERATION_MAX, _PERMISSION_MAX = 7, 4, 14, 3

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31


@dataclass(frozen=True, slots=True)
class Binding:
    """A kq ACL as Kafka writes it (wire codes, "kafka-cluster" for the cluster)."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


def binding_of(acl: kq_pb2.Acl) -> Binding:
    """The Kafka binding of a kq ACL (every kq ACL applies to every host)."""
    cluster = acl.resource_type == kq_pb2.ACL_RESOURCE_CLUSTER
    return Binding(
        _KAFKA_OF["resource"][acl.resource_type],
        KAFKA_CLUSTER_NAME if cluster else acl.resource_name,
        _KAFKA_OF["pattern"][acl.pattern_type],
        acl.principal,
        ANY_HOST,
        _KAFKA_OF["operation"][acl.operation],
        _KAFKA_OF["permission"][acl.permission],
    )


def acl_of_creation(creation: Any) -> kq_pb2.Acl | str:
    """The kq ACL a CreateAcls creation states, or why it is refused (INVALID_REQUEST): Kafka's own
    checks first (AclControlManager.validateNewAcl, the cluster resource's name), then kq's."""
    resource_type, pattern, operation = (
        creation.resource_type,
        creation.resource_pattern_type,
        creation.operation,
    )
    if resource_type in (UNKNOWN, ANY) or not 0 <= resource_type <= _RESOURCE_TYPE_MAX:
        return f"Invalid resourceType {resource_type}"
    if pattern not in PATTERN_TYPES:
        return f"Invalid patternType {pattern}"
    if operation in (UNKNOWN, ANY) or not 0 <= operation <= _OPERATION_MAX:
        return f"Invalid operation {operation}"
    if creation.permission_type not in PERMISSIONS:
        return f"Invalid permissionType {creation.permission_type}"
    if not creation.resource_name:
        return "Resource name should not be empty"
    if ":" not in creation.principal:
        return f"Could not parse principal from `{creation.principal[:80]}`"
    if resource_type == 4 and creation.resource_name != KAFKA_CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {KAFKA_CLUSTER_NAME}"
    if resource_type in KAFKA_RESOURCE_NAMES:
        return (
            f"kq has no {KAFKA_RESOURCE_NAMES[resource_type]} resources: only TOPIC, GROUP and CLUSTER ACLs"
        )
    if operation in KAFKA_OPERATION_NAMES:
        return f"kq has no {KAFKA_OPERATION_NAMES[operation]} operation (DESIGN.md, Security)"
    if creation.host != ANY_HOST:
        return "kq's ACLs apply to every host: the host must be '*'"
    cluster = resource_type == 4
    acl = kq_pb2.Acl(
        principal=creation.principal,
        resource_type=RESOURCE_TYPES[resource_type],
        resource_name=CLUSTER_RESOURCE if cluster else creation.resource_name,
        pattern_type=PATTERN_TYPES[pattern],
        operation=OPERATIONS[operation],
        permission=PERMISSIONS[creation.permission_type],
    )
    problem = acl_problem(acl)
    return acl if problem is None else problem


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter over Kafka bindings (wire codes; None: any)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int

    @classmethod
    def of(cls, body: Any) -> AclFilter:
        """The filter of a DescribeAcls request or a DeleteAcls filter (their field names agree)."""
        return cls(
            body.resource_type_filter,
            body.resource_name_filter,
            body.pattern_type_filter,
            body.principal_filter,
            body.host_filter,
            body.operation,
            body.permission_type,
        )

    def problem(self) -> str | None:
        """Why Kafka refuses the filter (AclBindingFilter.isUnknown, or a code past its enum)."""
        if self.resource_type == UNKNOWN or not 0 <= self.resource_type <= _RESOURCE_TYPE_MAX:
            return f"Invalid resource type filter {self.resource_type}"
        if self.pattern_type == UNKNOWN or not 0 <= self.pattern_type <= _PATTERN_TYPE_MAX:
            return f"Invalid pattern type filter {self.pattern_type}"
        if self.operation == UNKNOWN or not 0 <= self.operation <= _OPERATION_MAX:
            return f"Invalid operation filter {self.operation}"
        if self.permission_type == UNKNOWN or not 0 <= self.permission_type <= _PERMISSION_MAX:
            return f"Invalid permission type filter {self.permission_type}"
        return None

    def matches(self, binding: Binding) -> bool:
        """Kafka's ResourcePatternFilter.matches and AccessControlEntryFilter.matches."""
        if self.resource_type not in (ANY, binding.resource_type):
            return False
        if self.pattern_type not in (ANY, MATCH, binding.pattern_type):
            return False
        if self.resource_name is not None and not self._name_matches(binding):
            return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation not in (ANY, binding.operation):
            return False
        return self.permission_type in (ANY, binding.permission_type)

    def _name_matches(self, binding: Binding) -> bool:
        name = self.resource_name
        if self.pattern_type in (ANY, binding.pattern_type):
            return name == binding.resource_name
        if binding.pattern_type == PATTERN_KAFKA_LITERAL:  # MATCH: the ACLs that apply to `name`.
            return binding.resource_name in (name, "*")
        return name is not None and name.startswith(binding.resource_name)


def matching(acls: Iterable[kq_pb2.Acl], acl_filter: AclFilter) -> list[tuple[kq_pb2.Acl, Binding]]:
    """The ACLs the filter matches, each with its Kafka binding."""
    bound = ((acl, binding_of(acl)) for acl in acls)
    return [(acl, binding) for acl, binding in bound if acl_filter.matches(binding)]


def chunks(acls: Sequence[kq_pb2.Acl]) -> list[Sequence[kq_pb2.Acl]]:
    """`acls` in proposals of at most ACLS_PER_REQUEST_MAX."""
    return [acls[start : start + ACLS_PER_REQUEST_MAX] for start in range(0, len(acls), ACLS_PER_REQUEST_MAX)]


class AclApis(KafkaBase):
    """DescribeAcls, CreateAcls and DeleteAcls."""

    async def describe_acls(self, request: Request, connection: Connection) -> Any:
        """The ACLs matching the filter, grouped by resource (DESCRIBE on the cluster: checked whole,
        authorize.py `WHOLE`)."""
        module = response_module(DESCRIBE_ACLS, request.api_version)
        acl_filter = AclFilter.of(request.body)
        problem = acl_filter.problem()
        if problem is not None:
            return build(module.DescribeAclsResponse, error_code=INVALID_REQUEST, error_message=problem)
        try:
            acls, _ = await self._security_view()
        except KqError as error:
            code = kafka_code(error, NOT_CONTROLLER)
            return build(module.DescribeAclsResponse, error_code=code, error_message=str(error))
        by_resource: dict[tuple[int, str, int], list[Binding]] = {}
        for _acl, binding in matching(acls, acl_filter):
            key = (binding.resource_type, binding.resource_name, binding.pattern_type)
            by_resource.setdefault(key, []).append(binding)
        resources = tuple(
            build(
                module.DescribeAclsResource,
                resource_type=resource_type,
                resource_name=name,
                pattern_type=pattern,
                acls=tuple(
                    build(
                        module.AclDescription,
                        principal=binding.principal,
                        host=binding.host,
                        operation=binding.operation,
                        permission_type=binding.permission_type,
                    )
                    for binding in bindings
                ),
            )
            for (resource_type, name, pattern), bindings in sorted(by_resource.items())
        )
        return build(module.DescribeAclsResponse, error_code=NONE, resources=resources)

    async def create_acls(self, request: Request, connection: Connection) -> Any:
        """Adds each valid creation (ALTER on the cluster); one result per creation, in order."""
        module = response_module(CREATE_ACLS, request.api_version)
        creations = request.body.creations
        if not self._permitted(connection, ApiKey.CREATE_ACLS, CLUSTER, CLUSTER_RESOURCE):
            denied = build(module.AclCreationResult, error_code=CLUSTER_AUTHORIZATION_FAILED)
            return build(module.CreateAclsResponse, results=tuple(denied for _ in creations))
        outcomes: list[tuple[int, str | None]] = []
        valid: list[tuple[int, kq_pb2.Acl]] = []
        for position, creation in enumerate(creations):
            acl = acl_of_creation(creation)
            if isinstance(acl, str):
                outcomes.append((INVALID_REQUEST, acl))
            else:
                outcomes.append((NONE, None))
                valid.append((position, acl))
        for chunk_start in range(0, len(valid), ACLS_PER_REQUEST_MAX):
            chunk = valid[chunk_start : chunk_start + ACLS_PER_REQUEST_MAX]
            failure = await self._acl_write("AddAcls", [acl for _, acl in chunk])
            if failure is not None:
                for position, _ in chunk:
                    outcomes[position] = failure
        results = tuple(
            build(module.AclCreationResult, error_code=code, error_message=message)
            for code, message in outcomes
        )
        return build(module.CreateAclsResponse, results=results)

    async def delete_acls(self, request: Request, connection: Connection) -> Any:
        """Removes the ACLs each filter matches (ALTER on the cluster); answers them per filter."""
        module = response_module(DELETE_ACLS, request.api_version)
        filters = request.body.filters
        if not self._permitted(connection, ApiKey.DELETE_ACLS, CLUSTER, CLUSTER_RESOURCE):
            denied = build(module.DeleteAclsFilterResult, error_code=CLUSTER_AUTHORIZATION_FAILED)
            return build(module.DeleteAclsResponse, filter_results=tuple(denied for _ in filters))
        results = []
        try:
            acls, _ = await self._security_view()
        except KqError as error:
            failed = build(
                module.DeleteAclsFilterResult,
                error_code=kafka_code(error, NOT_CONTROLLER),
                error_message=str(error),
            )
            return build(module.DeleteAclsResponse, filter_results=tuple(failed for _ in filters))
        for body in filters:
            acl_filter = AclFilter.of(body)
            problem = acl_filter.problem()
            if problem is not None:
                results.append(
                    build(module.DeleteAclsFilterResult, error_code=INVALID_REQUEST, error_message=problem)
                )
                continue
            matched = matching(acls, acl_filter)
            failure = None
            for chunk in chunks([acl for acl, _ in matched]):
                failure = failure or await self._acl_write("RemoveAcls", chunk)
            code, message = failure if failure is not None else (NONE, None)
            results.append(
                build(
                    module.DeleteAclsFilterResult,
                    error_code=code,
                    error_message=message,
                    matching_acls=tuple(_matching_acl(module, binding) for _, binding in matched),
                )
            )
        return build(module.DeleteAclsResponse, filter_results=tuple(results))

    async def _acl_write(self, method: str, acls: Sequence[kq_pb2.Acl]) -> tuple[int, str] | None:
        """AddAcls or RemoveAcls on group 0's leader; (Kafka code, message) when it failed."""
        request = (kq_pb2.AddAclsRequest if method == "AddAcls" else kq_pb2.RemoveAclsRequest)(acls=acls)
        try:
            response = await self._on_leader(method, request)
        except KqError as error:
            return kafka_code(error, NOT_CONTROLLER), str(error)
        await self._security_seen(response.index)
        return None


def _matching_acl(module: Any, binding: Binding) -> Any:
    return build(
        module.DeleteAclsMatchingAcl,
        error_code=NONE,
        resource_type=binding.resource_type,
        resource_name=binding.resource_name,
        pattern_type=binding.pattern_type,
        principal=binding.principal,
        host=binding.host,
        operation=binding.operation,
        permission_type=binding.permission_type,
    )
