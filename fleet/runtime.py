"""The infrastructure a runner needs, built once per process."""

from __future__ import annotations

import functools
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fleet.config.webfilter import OPEN, DomainFilter, DomainRules
from fleet.experiences.store import EXPERIENCES, ExperienceStore
from fleet.limits.capability import LIMITS
from fleet.limits.gate import Gate
from fleet.limits.protocols import TreeSchedules
from fleet.llm.base import LLMClient
from fleet.llm.clients import make_client, validate_model
from fleet.llm.config import (
    FleetConfig,
    load_config,
    resolve_model_name,
)
from fleet.llm.retry import DEFAULT_RETRY
from fleet.llm.vision import Wire
from fleet.models import Mode, Trace
from fleet.observe.hooks import NO_HOOKS, Hooks
from fleet.presets import READ_ONLY_MODES, AgentPreset, get_preset, load_presets
from fleet.security.redact import SHAPES_ONLY, Redactor
from fleet.security.trust import check_workspace_root
from fleet.settings import Settings
from fleet.storage.caches import search_answers
from fleet.storage.images import ImageStore, image_store
from fleet.storage.leases import LeaseKeeper
from fleet.storage.store import Services, TraceSnapshot, TraceStore
from fleet.tools.base import WebSearcher
from fleet.tools.registry import ToolRegistry, default_registry

if TYPE_CHECKING:  # what only a process running agents builds, imported by `build`
    from fleet.experiences.embedding import Embedder
    from fleet.mcp.sessions import McpSessions
    from fleet.tools.websearch.cache import SearchCache


@dataclass(frozen=True)
class SpawnRequest:
    """Children created for one tool call, ready for a dispatcher."""

    parent_trace_id: str
    root_trace_id: str
    tool_call_id: str
    tool_name: str
    mode: Mode
    children: tuple[Trace, ...]
    """The child traces as created (or reopened): a dispatcher need not read them back."""
    scheduled: bool | None = None
    """Whether the tree has a schedule of its own (`RunState.scheduled` of the root that
    spawns); None: not known, a dispatcher that needs it reads it."""

    @property
    def child_ids(self) -> tuple[str, ...]:
        """The children's trace ids, in order."""
        return tuple(c.trace_id for c in self.children)


class Dispatcher(Protocol):
    """Runs the children of one tool call and, when they are done, has them settled.

    Implementations: `fleet.inprocess.InProcessDispatcher` (threads in this process) and
    `workers.dispatch.CeleryDispatcher` (a chord whose body settles the call).
    """

    children_survive_restart: bool
    """True when children keep running if the parent's process dies (a task queue)."""

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Start the children; may return before they finish."""
        ...


def operator_config(settings: Settings) -> FleetConfig:
    """`fleet.yaml` as the operator set it: `FLEET_CONFIG`, never inside a workspace root."""
    return load_config(
        settings.config_path,
        env=settings.env,
        workspace_roots=settings.workspace_roots,
        key_envs=settings.api_key_envs,
    )


@dataclass(frozen=True)
class Runtime:
    """Store, dispatcher, presets, tools and models: what every run shares."""

    store: TraceStore
    dispatcher: Dispatcher
    settings: Settings
    config: FleetConfig
    presets: Mapping[str, AgentPreset]
    tools: ToolRegistry
    gate: Gate
    """Budgets and provider limits in front of every model call (the store keeps them)."""
    trees: TreeSchedules | None = None
    """Each tree's schedule and run window (`build` takes the store's)."""
    hooks: Hooks = NO_HOOKS
    clients: dict[str, LLMClient] = field(default_factory=dict)
    """Model name -> client; tests put scripted models here, others are built on demand."""
    leases: LeaseKeeper | None = None
    """The process's one heartbeat; `build` makes it (it starts with the first lease)."""
    redactor: Redactor = SHAPES_ONLY
    """Masks this process's secrets in everything a run writes (see fleet.security.redact)."""
    search: WebSearcher | None = None
    """fleet.yaml's search provider for `web_search`; None when it sets none."""
    mcp: McpSessions | None = None
    """The process's MCP sessions, when fleet.yaml declares `mcp_servers` (started on use)."""
    experiences: ExperienceStore | None = None
    """Rules learnt from earlier runs (`fleet.experiences`); `build` gives one per store."""
    embedder: Embedder | None = None
    """fleet.yaml's `experiences.embedding_model`, which then ranks them; None: BM25."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(
        cls,
        settings: Settings,
        store: TraceStore,
        dispatcher: Dispatcher,
        *,
        clients: Mapping[str, LLMClient] | None = None,
        hooks: Hooks = NO_HOOKS,
        runs_agents: bool = True,
    ) -> Runtime:
        """Load fleet.yaml and the presets; `ConfigError` names what is wrong.

        `runs_agents=False`: a client of the fleet (`fleet.client.Fleet`), which submits
        roots and reads traces but runs no agent: it gets no tools, search or MCP sessions
        and imports none of them (`fleet run` starts that much sooner).
        """
        from fleet.experiences.embedding import make_embedder

        config = operator_config(settings)
        gate = Gate.for_store(store, config, settings.env)
        redactor = Redactor.from_env(settings.env)
        presets = load_presets(
            settings.agents_dir, settings.env, workspace_roots=settings.workspace_roots
        )
        embedder = make_embedder(config, settings.env)
        experiences = _experiences(store, embedder)
        runtime = cls(
            store=store,
            dispatcher=dispatcher,
            settings=settings,
            config=config,
            presets=presets,
            tools=ToolRegistry(),
            gate=gate,
            trees=store.capability(LIMITS).trees,
            hooks=hooks,
            experiences=experiences,
            embedder=embedder,
            clients=dict(clients or {}),
            leases=LeaseKeeper(store, settings.lease_ttl_ms),
            redactor=redactor,
        )
        return runtime._with_agents(experiences) if runs_agents else runtime

    def _with_agents(self, experiences: ExperienceStore) -> Runtime:
        """A copy with what running agents takes: tools, search, MCP, outcome hooks."""
        from fleet.experiences.outcomes import with_outcomes
        from fleet.mcp.sessions import McpSessions

        config, env = self.config, self.settings.env
        return replace(
            self,
            tools=default_registry(),
            hooks=with_outcomes(self.hooks, experiences, self.presets),
            search=_search(config, self.settings, self.store, self.gate, self.redactor),
            mcp=McpSessions(config.mcp_servers, env) if config.mcp_servers else None,
        )

    def sync_mcp_tools(
        self, servers: Collection[str] | None = None, *, need: str | None = None
    ) -> None:
        """Bring the MCP servers' tools into the registry (cheap when nothing changed).

        `servers`: those the turn may use (None: every one); `need`: the server whose tool
        is about to be called (`fleet.mcp.tools.sync` says who waits for a listing).
        """
        if self.mcp is not None:
            from fleet.mcp.tools import sync

            sync(self.tools, self.mcp, servers, need=need)

    @functools.cached_property
    def shows_experiences(self) -> frozenset[str]:
        """The presets whose first messages show experiences (`StartRun.experiences`)."""
        if self.experiences is None:
            return frozenset()
        return frozenset(name for name, preset in self.presets.items() if preset.experiences)

    def experiences_held(self) -> str | None:
        """The version this process holds the experiences at, if a run start shows them."""
        if not self.shows_experiences or self.experiences is None:
            return None
        return self.experiences.held_version()

    def began(self, snapshot: TraceSnapshot) -> None:
        """What a run's `begin_run` read for its limits and experiences, handed to them."""
        self.gate.learn_budget(snapshot.trace.root_trace_id, snapshot.budgeted)
        if self.experiences is not None:
            self.experiences.note_version(snapshot.experiences)

    def fenced(self, trace_id: str, owner: str) -> Runtime:
        """A copy whose store writes only while `owner` holds the lease of `trace_id`."""
        return replace(self, store=self.store.fenced(trace_id, owner))

    def lease_keeper(self) -> LeaseKeeper:
        """The heartbeat that renews this process's leases."""
        if self.leases is None:
            raise RuntimeError("Runtime built without a LeaseKeeper: use Runtime.build")
        return self.leases

    def preset(self, name: str) -> AgentPreset:
        """The preset, or `ConfigError` listing the known ones."""
        return get_preset(self.presets, name)

    def temperature(self, trace: Trace) -> float | None:
        """The trace's sampling temperature: its submitter's, else its preset's.

        The submitter's was checked against the preset when the root was created.
        """
        asked = trace.context.get("temperature")
        return float(asked) if asked is not None else self.preset(trace.preset).temperature

    def context_window(self, model_name: str) -> int | None:
        """The `context_window` of a model alias in fleet.yaml, if it has one."""
        alias = self.config.models.get(model_name)
        return alias.context_window if alias is not None else None

    @property
    def images(self) -> ImageStore:
        """The tree images beside the store (`fleet.storage.images`)."""
        return image_store(self.store)

    def wire_of(self, model_name: str) -> Wire | None:
        """The wire format of a model (`openai`, `anthropic`); None for a scripted one."""
        alias = self.config.models.get(model_name)
        if alias is not None and alias.provider in self.config.providers:
            return self.config.providers[alias.provider].kind
        prefix = model_name.split(":", 1)[0]
        if prefix in self.config.providers:
            return self.config.providers[prefix].kind
        return None

    def has_vision(self, model_name: str) -> bool:
        """False when fleet.yaml says the model alias takes no images (`vision: false`)."""
        alias = self.config.models.get(model_name)
        return alias is None or alias.vision

    def permissions(self, trace: Trace) -> AgentPreset:
        """What `trace` may do: its preset within the ceiling it inherited.

        explore and evaluate traces are read-only whatever their preset says; this is the
        preset every tool call of the trace is checked against.
        """
        ceiling = trace.ceiling
        read_only = ceiling.read_only or trace.mode in READ_ONLY_MODES
        preset = self.preset(trace.preset)
        return preset.within(ceiling.allowed, ceiling.denied, read_only, ceiling.mcp)

    def web_filter(self, trace: Trace) -> DomainFilter:
        """fleet.yaml's `web:` filter, narrowed by the parent's and the preset's (never widened).

        The first layer is always fleet.yaml's (`child_ceiling` passes on the others).
        """
        narrowed = OPEN.narrowed(self.config.web.rules())
        for layer in trace.ceiling.web:  # the parent's filter: a child's ceiling
            allow = None if layer.allow is None else tuple(layer.allow)
            narrowed = narrowed.narrowed(DomainRules(allow, tuple(layer.deny)))
        return narrowed.narrowed(self.preset(trace.preset).web)

    def search_cache(self, trace: Trace) -> SearchCache | None:
        """The cache of `web_search` answers when `trace`'s preset allows one."""
        preset = self.preset(trace.preset)
        search = self.search
        if not preset.cache_ttl_s or "web_search" not in preset.cache_tools or search is None:
            return None
        from fleet.tools.websearch.cache import SearchCache
        from fleet.tools.websearch.service import SearchService

        provider = repr(search)
        if isinstance(search, SearchService):  # its address and key digest, never the key
            provider = f"{search.scopes[0].name} {search.config.base_url}"
        return SearchCache(search_answers(self.store), preset.cache_ttl_s, provider)

    def model_name(self, explicit: str | None, preset: str) -> str:
        """Explicit name, else the preset's, the config override, FLEET_MODEL, the default."""
        if explicit is None and (preset_model := self.preset(preset).model):
            explicit = preset_model
        if explicit is not None and explicit in self.clients:
            return explicit
        return resolve_model_name(self.config, explicit, preset, self.settings.env)

    def workspace_of(self, trace: Trace) -> Path:
        """The trace's real workspace, checked against this process's workspace roots.

        Checked where tools run, not only at submission: a task message or a trace in
        Redis may have been forged, and this worker's roots are what it may read.

        Raises:
            ConfigError: the workspace lies outside every root.
        """
        workspace = Path(trace.workspace) if trace.workspace else self.settings.workspace
        return check_workspace_root(workspace, self.settings.workspace_roots)

    def check_model(self, model_name: str) -> None:
        """What `client` would check, without building one; `ConfigError` if it would fail."""
        if model_name not in self.clients:
            validate_model(
                self.config,
                model_name,
                self.settings.env,
                allow_scripted=self.settings.allow_scripted,
            )

    def client(self, model_name: str) -> LLMClient:
        """A client for this model name, built once per process."""
        with self._lock:
            if model_name not in self.clients:
                # With a fleet-wide limiter a 429 is handed back at once, not slept on.
                retry = replace(DEFAULT_RETRY, hand_back_overload=self.gate.limiter is not None)
                self.clients[model_name] = make_client(
                    self.config,
                    model_name,
                    self.settings.env,
                    allow_scripted=self.settings.allow_scripted,
                    retry=retry,
                )
            return self.clients[model_name]


def _search(
    config: FleetConfig, settings: Settings, store: Services, gate: Gate, redactor: Redactor
) -> WebSearcher | None:
    """The search provider fleet.yaml names, counting each tree's searches beside the store."""
    if config.search is None:
        return None
    from fleet.tools.websearch.service import SearchService

    return SearchService(
        config.search,
        settings.env,
        store.capability(LIMITS).searches,
        limiter=gate.limiter,
        web_allow=settings.web_allow,
        redactor=redactor,
    )


def _experiences(store: Services, embedder: Embedder | None) -> ExperienceStore:
    found = store.capability(EXPERIENCES)
    if embedder is None:
        return found
    from fleet.experiences.embedding import IndexedExperiences

    # With an embedding model, storing an approved experience embeds it.
    return IndexedExperiences(found, embedder)
