"""What a chaos run serves its fleets besides the store: providers, MCP servers, fleet.yaml.

- the hostile OpenAI-wire provider (`chaos_parts.provider`) as model `flaky`, with a rate
  limit of its own in fleet.yaml (`limits: requests_per_minute`) and, as faults, an outage
  (`provider-down`: 503s) and a rate limit hit (`provider-429`: 429 with `Retry-After: 1`);
- the Batch API provider (`chaos_parts.batches`) as model `batched`, and its fault
  `batch-malformed` (hostile lines in the next output file);
- MCP servers: the repository's test server (quick, huge, slow tools, and an approval
  rule), a server whose re-listing hangs (`lister`), and the real `mcp-server-git` where
  it is installed, on a repository of the run's own;
- a remote A2A agent (`tests/a2a_agent.py`, a2a-sdk's own server) as `reviewer`;
- the approved experience each session's store starts with.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.chaos_parts import workload
from bench.chaos_parts.batches import BATCH_ENV, BATCH_MODEL, BatchProvider
from bench.chaos_parts.provider import MODEL, HostileProvider
from fleet.client import Fleet
from fleet.experiences.model import new_experience
from tests.a2a_agent import serve_reviewer
from tests.mcpkit import RAW_SERVER, server_entry, write_config

GIT_SERVER = Path(sys.executable).with_name("mcp-server-git")
PROVIDER_RPM = 600
"""The hostile provider's fleet-wide `requests_per_minute` (fleet.yaml `limits:`)."""


class Rig:
    """The providers and the config of a run; `close` when done."""

    def __init__(self, folder: Path, seed: int) -> None:
        """Start the providers; write fleet.yaml and the git repository."""
        self.folder = folder
        self.hostile = HostileProvider(failure_rate=0.1, hostile_rate=0.1, seed=seed)
        self.batch = BatchProvider(seed)
        self._stack = contextlib.ExitStack()
        self.remote = self._stack.enter_context(serve_reviewer())
        self.git = GIT_SERVER.exists() and shutil.which("git") is not None
        if self.git:
            _git_repository(folder / "repo")
        self.config = self._config()
        self.env = {**BATCH_ENV, "FLEET_CONFIG": str(self.config), "FLEET_REMOTE_POLL_S": "0.3"}
        self.faults: dict[str, Callable[[int], None]] = {
            "provider-down": lambda n: self.hostile.down_for(2 + n % 9),
            "provider-429": lambda n: self.hostile.limit_for(1 + n % 4),
            "batch-malformed": lambda n: self.batch.malform_next(),
        }

    def _config(self) -> Path:
        limits = {"requests_per_minute": PROVIDER_RPM}
        providers = {
            "flaky": {"kind": "openai", "base_url": self.hostile.base_url, "limits": limits},
            "batchy": {"kind": "openai", "base_url": f"{self.batch.url}/v1", "batch_api": True},
        }
        models = {
            MODEL: {"provider": "flaky", "name": "flaky-1"},
            BATCH_MODEL: {"provider": "batchy", "name": "batched-1"},
        }
        servers = {
            workload.MCP_SERVER: server_entry(),
            workload.LISTER: {
                "command": sys.executable,
                "args": ["-I", str(RAW_SERVER), "hang_relist"],
            },
        }
        if self.git:
            repo = str(self.folder / "repo")
            servers[workload.GIT] = {"command": str(GIT_SERVER), "args": ["--repository", repo]}
        remote = {"url": self.remote.url, "private": True, "read_only": True, "timeout_s": 60}
        return write_config(
            self.folder / "fleet.yaml",
            servers,
            providers=providers,
            models=models,
            approve=[workload.APPROVE_RULE],
            remote_agents={workload.REMOTE_AGENT: remote},
        )

    def hostile_counts(self) -> dict[str, int]:
        """Hostile answers sent, by kind."""
        return {
            **self.hostile.hostile,
            "429-windows": self.hostile.rate_limited,
            **self.batch.hostile,
        }

    def close(self) -> None:
        """Stop the providers."""
        self.hostile.close()
        self.batch.stop()
        self._stack.close()

    def remote_doubled(self, since: int) -> list[str]:
        """Remote tasks sent twice for one tree's call: the same text in two messages of
        different `messageId`s. A message sent again with its id (a run that lost the record
        of its send to a Redis kill sends it again, `fleet.remote.run.message_id_of`) is one
        to an agent that dedupes by id, as A2A lets it."""
        record = self.remote.record
        sent: dict[str, set[str]] = {}
        for (_, _, text), message_id in zip(
            record.messages[since:], record.message_ids[since:], strict=True
        ):
            sent.setdefault(text, set()).add(message_id)
        return [
            f"remote task {t!r} sent {len(ids)} times" for t, ids in sent.items() if len(ids) > 1
        ]


def seed_experience(fleet: Fleet) -> str:
    """The approved experience `experience` trees are shown; its id."""
    condition, rule = workload.SEEDED
    experience = new_experience(workload.EXPERIENCE_SCOPE, condition, rule, approved=True)
    fleet.experiences.put(experience)
    return experience.id


def _git_repository(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("chaos\n")
    for argv in (
        ["git", "init", "-q"],
        ["git", "add", "README.md"],
        ["git", "-c", "user.name=chaos", "-c", "user.email=c@example.org", "commit", "-qm", "one"],
    ):
        subprocess.run(argv, cwd=path, check=True, capture_output=True, timeout=60)
