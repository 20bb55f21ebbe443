"""What the local deployer makes of a resource (``Physical``: what Ref and Fn::GetAtt give) and of a resource type
(``Handler``: its deploy), shared by the deployer and the modules of handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from local_runtime.template import LOCAL_ACCOUNT, LOCAL_REGION

if TYPE_CHECKING:
    from local_runtime.deployer import Deployment


@dataclass
class Physical:
    """A deployed (or emulated) resource: what Ref gives, its attributes for Fn::GetAtt, its resolved properties."""

    logical_id: str
    type: str
    ref: Any
    attributes: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)


Handler = Callable[["Deployment", str, dict[str, Any]], Physical]


def arn_of(service: str, resource: str, *, region: str = LOCAL_REGION, account: str = LOCAL_ACCOUNT) -> str:
    return f"arn:aws:{service}:{region}:{account}:{resource}"
