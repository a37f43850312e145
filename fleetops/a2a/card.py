"""The fleet's Agent Card: one skill per preset marked `a2a: true`, a bearer scheme."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import ConfigError
from fleet.presets.preset import AgentPreset

SCHEME = "bearer"
"""The security scheme's name in the card (`Authorization: Bearer <FLEET_SERVE_TOKEN>`)."""


def a2a_presets(presets: Mapping[str, AgentPreset]) -> list[AgentPreset]:
    """The presets offered as skills, by name.

    Raises:
        ConfigError: no preset is marked `a2a: true`.
    """
    offered = [p for _, p in sorted(presets.items()) if p.a2a]
    if not offered:
        raise ConfigError(
            "fleet a2a: no preset is marked `a2a: true` (a preset file in FLEET_AGENTS_DIR)"
        )
    return offered


def agent_card(url: str, presets: list[AgentPreset]) -> Any:
    """The card a2a-sdk serves at `/.well-known/agent-card.json`; JSON-RPC at `url`."""
    from a2a.types import a2a_pb2 as pb

    skills = [
        pb.AgentSkill(
            id=p.name,
            name=p.name,
            description=p.description or f"the fleet's {p.name!r} preset",
            tags=["fleet", "read-only" if p.read_only else "writes"],
        )
        for p in presets
    ]
    bearer = pb.HTTPAuthSecurityScheme(scheme="Bearer", description="FLEET_SERVE_TOKEN")
    return pb.AgentCard(
        name="agent-fleet",
        description="A Celery worker fleet of LLM agents: each task runs a tree of agents.",
        version="1",
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=pb.AgentCapabilities(streaming=True),
        security_schemes={SCHEME: pb.SecurityScheme(http_auth_security_scheme=bearer)},
        security_requirements=[pb.SecurityRequirement(schemes={SCHEME: pb.StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )
