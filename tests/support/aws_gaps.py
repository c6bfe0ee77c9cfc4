"""Answers for the few AWS operations moto 5.2.5 does not implement, inside a moto test.

Everything else goes to moto. The operations covered here are exactly those moto answers with
"not implemented" (checked when this was written): EC2 capacity reservations and placement
groups, Service Quotas outside the VPC service, and EKS DescribeClusterVersions,
DescribeAddonVersions and DescribeUpdate.

Each answer is a function of the call's parameters, and every response is checked against the
operation's output shape in botocore's service model before the client sees it, so a test cannot
feed the code a response the real API could not return. Calls are recorded for assertions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import boto3
from botocore.awsrequest import AWSResponse
from botocore.validate import validate_parameters


class ServiceError(Exception):
    """Raise from an answer to make the client raise ClientError with this code."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


Answer = Callable[[dict], dict]


@dataclass
class ServiceGaps:
    session: boto3.Session
    calls: list[tuple[str, str, dict]] = field(default_factory=list)
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)

    def answer(self, service_id: str, operation: str, fn: Answer) -> None:
        """Serve `operation` (e.g. "ec2", "DescribeCapacityReservations") with `fn(params)`;
        a later answer for the same operation replaces the earlier one."""
        key = (service_id, operation)
        first = key not in self.answers
        self.answers[key] = fn
        if not first:
            return

        def keep_params(params, context, **_):
            context["gap_params"] = dict(params)

        def respond(model, context, **_):
            params = context.get("gap_params", {})
            self.calls.append((service_id, operation, params))
            try:
                parsed = self.answers[key](params)
            except ServiceError as e:
                error = {
                    "Error": {"Code": e.code, "Message": e.message},
                    "ResponseMetadata": {"HTTPStatusCode": e.status},
                }
                return AWSResponse(None, e.status, {}, None), error
            if model.output_shape is None:
                assert parsed == {}, f"{operation} returns no data"
            else:
                validate_parameters(parsed, model.output_shape)
            return AWSResponse(None, 200, {}, None), {**parsed, "ResponseMetadata": {"HTTPStatusCode": 200}}

        # Registered on the session before clients are created, so every client made from it
        # carries the handlers.
        self.session.events.register(f"before-parameter-build.{service_id}.{operation}", keep_params)
        self.session.events.register(f"before-call.{service_id}.{operation}", respond)

    def called(self, operation: str) -> list[dict]:
        return [params for _, op, params in self.calls if op == operation]


# ----- ready-made answers -------------------------------------------------------------------


def quotas_answer(values: dict[tuple[str, str], tuple[str, float]]) -> Answer:
    """GetServiceQuota / GetAWSDefaultServiceQuota from {(service, code): (name, value)}."""

    def answer(params: dict) -> dict:
        key = (params["ServiceCode"], params["QuotaCode"])
        if key not in values:
            raise ServiceError("NoSuchResourceException", f"quota {key} not found")
        name, value = values[key]
        return {"Quota": {"ServiceCode": key[0], "QuotaCode": key[1], "QuotaName": name, "Value": value}}

    return answer


def list_quotas_answer(quotas: dict[str, list[tuple[str, str, float]]]) -> Answer:
    """ListServiceQuotas from {service: [(code, name, value), ...]}."""

    def answer(params: dict) -> dict:
        items = quotas.get(params["ServiceCode"], [])
        return {
            "Quotas": [
                {"ServiceCode": params["ServiceCode"], "QuotaCode": code, "QuotaName": name, "Value": value}
                for code, name, value in items
            ]
        }

    return answer


def capacity_reservations_answer(reservations: list[dict]) -> Answer:
    def answer(params: dict) -> dict:
        wanted = params.get("CapacityReservationIds") or [r["CapacityReservationId"] for r in reservations]
        found = [r for r in reservations if r["CapacityReservationId"] in wanted]
        missing = set(wanted) - {r["CapacityReservationId"] for r in found}
        if missing:
            raise ServiceError(
                "InvalidCapacityReservationId.NotFound",
                f"The capacity reservation ID '{sorted(missing)[0]}' does not exist",
            )
        return {"CapacityReservations": found}

    return answer


def cluster_versions_answer(versions: dict[str, str]) -> Answer:
    """DescribeClusterVersions from {"1.35": "STANDARD_SUPPORT", ...}."""

    def answer(params: dict) -> dict:
        wanted = params.get("clusterVersions") or list(versions)
        return {
            "clusterVersions": [
                {"clusterVersion": v, "versionStatus": versions[v], "clusterType": "eks"}
                for v in wanted
                if v in versions
            ]
        }

    return answer


def addon_versions_answer(offers: dict[tuple[str, str], list[str]]) -> Answer:
    """DescribeAddonVersions from {(kubernetes minor, add-on name): [builds, default first]}."""

    def answer(params: dict) -> dict:
        minor, name = params["kubernetesVersion"], params["addonName"]
        builds = offers.get((minor, name), [])
        if not builds:
            return {"addons": []}
        versions = [
            {
                "addonVersion": build,
                "architecture": ["amd64", "arm64"],
                "compatibilities": [{"clusterVersion": minor, "platformVersions": ["*"], "defaultVersion": i == 0}],
                "requiresConfiguration": False,
            }
            for i, build in enumerate(builds)
        ]
        return {"addons": [{"addonName": name, "type": "networking", "addonVersions": versions, "owner": "aws"}]}

    return answer


@dataclass
class PlacementGroups:
    """DescribePlacementGroups / DeletePlacementGroup over an in-test list."""

    groups: list[dict] = field(default_factory=list)

    def install(self, gaps: ServiceGaps) -> None:
        gaps.answer("ec2", "DescribePlacementGroups", self._describe)
        gaps.answer("ec2", "DeletePlacementGroup", self._delete)

    def _describe(self, params: dict) -> dict:
        groups = self.groups
        for f in params.get("Filters", []):
            if f["Name"].startswith("tag:"):
                key = f["Name"][4:]
                groups = [
                    g for g in groups if any(t["Key"] == key and t["Value"] in f["Values"] for t in g.get("Tags", []))
                ]
        return {"PlacementGroups": groups}

    def _delete(self, params: dict) -> dict:
        before = len(self.groups)
        self.groups = [g for g in self.groups if g["GroupName"] != params["GroupName"]]
        if len(self.groups) == before:
            raise ServiceError(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{params['GroupName']}' is unknown."
            )
        return {}
