"""Documentation placeholders: example values a profile carries until its user replaces them.

The shipped profiles (infra/profiles/) name AWS's documentation example account and open the API
endpoint to an RFC 5737 documentation network, on purpose: users edit them, and the offline suite
synthesizes them as they are. Deployed as they are, the example account stops `cdk deploy` at
once, but an endpoint open only to 203.0.113.0/24 (a range no client is ever in) and an access
entry for an example admin role are accepted: the cluster comes up after 40 minutes and its user
cannot reach it. So synth warns (offline rehearsal must still work) and preflight fails; both ask
`documentation_placeholders` here, the one definition of what a placeholder is.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from infra.config.deployment import ROLE_ARN_COMMAND, DeploymentConfig

#: Account ids AWS documentation uses as examples: 111122223333, 444455556666 and 777788889999
#: (the AWS style for example accounts) and 123456789012 (the older, still ubiquitous one).
DOCUMENTATION_ACCOUNTS = frozenset({"111122223333", "444455556666", "777788889999", "123456789012"})

#: RFC 5737: TEST-NET-1, -2 and -3, reserved for documentation and never routed on the internet.
DOCUMENTATION_NETWORKS = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))

_ARN_ACCOUNT = re.compile(r"^arn:[^:]+:iam::(\d{12}):")


def is_documentation_account(account: str) -> bool:
    return account in DOCUMENTATION_ACCOUNTS


def is_documentation_cidr(cidr: str) -> bool:
    """A CIDR wholly inside a documentation network: no real client's address can be in it."""
    network = ipaddress.IPv4Network(cidr, strict=False)
    return any(network.subnet_of(doc) for doc in DOCUMENTATION_NETWORKS)


@dataclass(frozen=True)
class Placeholder:
    """One profile field still holding a documentation example, and how to replace it."""

    field: str
    value: str
    fix: str

    @property
    def problem(self) -> str:
        return f"{self.field}: {self.value} is a documentation placeholder"

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}"


def documentation_placeholders(config: DeploymentConfig) -> list[Placeholder]:
    """Every field of `config` that still holds a documentation example, in profile order."""
    found = []
    if is_documentation_account(config.account):
        found.append(
            Placeholder(
                "account",
                config.account,
                "set it to the 12-digit id of the account you deploy to (aws sts get-caller-identity --query Account)",
            )
        )
    arn = config.admin_principal_arn
    match = _ARN_ACCOUNT.match(arn or "")
    if arn and match and is_documentation_account(match.group(1)):
        found.append(
            Placeholder(
                "admin_principal_arn",
                arn,
                "set it to the IAM role or user that will run kubectl and nvrx-eks: a role's full ARN, including "
                f"its path (`{ROLE_ARN_COMMAND.format(role='NAME')}`; NAME is what `aws sts get-caller-identity "
                "--query Arn` prints after assumed-role/), or a user's (`aws iam get-user --query User.Arn`)",
            )
        )
    cidrs = [c for c in config.endpoint.public_cidrs if is_documentation_cidr(c)]
    if cidrs:
        found.append(
            Placeholder(
                "endpoint.public_cidrs",
                ", ".join(cidrs),
                "list the networks you reach the Kubernetes API from instead, such as your address as a /32 "
                "(curl https://checkip.amazonaws.com), or set endpoint.access: private",
            )
        )
    return found
