"""Embeddings over the OpenAI wire: `POST {base_url}/embeddings`.

OpenAI, vLLM, Ollama, LiteLLM and most local servers answer it. What the server sends back
is checked before anyone uses it (one vector per input, in order, all of one size, finite
numbers): a hostile or broken endpoint gives `ModelBehaviorError`, never a wrong ranking.
fleet.yaml names the model in its `experiences:` section (an alias of `models:` whose
provider speaks the OpenAI wire); `check_embedding_model` checks that when the file loads::

    experiences:
      embedding_model: embed       # models.embed: {provider: openai, name: text-embedding-3-small}
      min_similarity: 0.3          # a rule less similar to the task than this is not shown
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.errors import ConfigError, ModelBehaviorError
from fleet.llm.base import check_model_requests_allowed
from fleet.llm.retry import RetryPolicy, send_with_retry
from fleet.security.numbers import finite_number
from fleet.security.redact import SHAPES_ONLY, Redactor

if TYPE_CHECKING:
    import httpx

EMBED_TIMEOUT_S = 5.0
"""Per request: a run waits on it before its first turn, a person on `experience add`; with
the one retry, a hung endpoint costs a run at most ~11 s once, then the
embedder's cool-off (`fleet.experiences.embedding`) of BM25."""
EMBED_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.25, max_delay_s=1.0)
"""One retry at most: a failing endpoint costs a run a second, then BM25 ranks instead."""
MAX_DIMENSIONS = 16_384
MAX_COMPONENT = 1e6
"""Largest magnitude of one vector component (models give |x| <= 1, some a few hundred):
beyond it a dot product of 16,384 of them could overflow to `inf`."""
MAX_INPUT_CHARS = 8_000
"""Each text is cut here (about 2,000 tokens): an experience or a task is far shorter."""

Vector = tuple[float, ...]


class ExperiencesSection(BaseModel):
    """fleet.yaml's `experiences:`: how the experiences a run is shown are ranked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embedding_model: str | None = None
    """An alias of `models:`; None: BM25 over the words ranks them."""
    min_similarity: float = Field(default=0.3, ge=-1.0, le=1.0)
    """Cosine similarity to the task below which an experience is not shown."""


def check_embedding_model(
    source: str,
    section: ExperiencesSection,
    providers_of: Mapping[str, str],
    kinds: Mapping[str, str],
) -> None:
    """`ConfigError` unless no model is named or it is an alias of an OpenAI-wire model.

    `providers_of`: alias -> its provider; `kinds`: provider -> its wire (`openai`, ...).
    """
    name = section.embedding_model
    if name is None:
        return
    provider = providers_of.get(name)
    if provider is None:
        known = ", ".join(sorted(providers_of)) or "none"
        raise ConfigError(
            f"{source}: experiences.embedding_model: {name!r} is not an alias of models"
            f" (aliases: {known})"
        )
    if kinds.get(provider) != "openai":
        raise ConfigError(
            f"{source}: experiences.embedding_model: {name!r} needs a provider of kind openai"
            " (the /embeddings endpoint)"
        )


class EmbeddingsClient:
    """Vectors for texts from one model of an OpenAI-wire provider."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        provider: str = "openai",
        api_key_env: str = "OPENAI_API_KEY",
        http: httpx.Client | None = None,
        redactor: Redactor = SHAPES_ONLY,
        retry: RetryPolicy = EMBED_RETRY,
    ) -> None:
        """A client; `api_key` may be empty for a local server (no header is sent then).

        The HTTP client is made at the first request: every command builds a Runtime, few
        of them embed anything.
        """
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.provider = provider
        self._api_key = api_key
        self._api_key_env = api_key_env
        self._http = http
        self._lock = threading.Lock()
        self._redactor = redactor.with_values([api_key])
        self._retry = retry

    def __repr__(self) -> str:
        return f"EmbeddingsClient(base_url={self.base_url!r}, model={self.model!r})"

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """One vector per text, in order.

        Raises:
            TransientLLMError: the endpoint kept failing (429, 5xx, network).
            ConfigError: 401/403/404 (key, base_url or model wrong).
            ModelBehaviorError: any other refusal, or an answer that is not the vectors.
        """
        if not texts:
            return []
        check_model_requests_allowed(self.provider)
        body = {"model": self.model, "input": [t[:MAX_INPUT_CHARS] for t in texts]}
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        http = self._client()
        response = send_with_retry(
            lambda: http.post(f"{self.base_url}/embeddings", json=body, headers=headers),
            provider=self.provider,
            api_key_env=self._api_key_env,
            policy=self._retry,
            redactor=self._redactor,
        )
        try:
            data = response.json()
        except ValueError:
            raise ModelBehaviorError(f"{self.provider}: /embeddings answered no JSON") from None
        return parse_vectors(data, len(texts), self.provider)

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                import httpx  # here: a process that never embeds never imports it

                self._http = httpx.Client(timeout=EMBED_TIMEOUT_S)
            return self._http


def parse_vectors(data: Any, count: int, provider: str) -> list[Vector]:
    """`data[*].embedding` ordered by `index`, checked; `ModelBehaviorError` says what is off."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) != count:
        raise ModelBehaviorError(f"{provider}: /embeddings sent no vector per input ({count})")
    by_index: dict[int, Vector] = {}
    for position, item in enumerate(items):
        index = item.get("index", position) if isinstance(item, dict) else None
        raw = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or index in by_index:
            raise ModelBehaviorError(f"{provider}: /embeddings sent a bad index {index!r}")
        by_index[index] = _vector(raw, provider)
    sizes = {len(v) for v in by_index.values()}
    if len(sizes) != 1:
        raise ModelBehaviorError(f"{provider}: /embeddings sent vectors of different sizes")
    return [by_index[i] for i in range(count)]


def _vector(raw: Any, provider: str) -> Vector:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_DIMENSIONS:
        raise ModelBehaviorError(f"{provider}: /embeddings sent a vector that is not a list")
    what = f"{provider}: /embeddings vector component"
    vector = tuple(
        finite_number(x, what, low=-MAX_COMPONENT, high=MAX_COMPONENT, error=ModelBehaviorError)
        for x in raw
    )
    if not any(vector):
        raise ModelBehaviorError(f"{provider}: /embeddings sent a zero vector")
    return vector


def unit(vector: Vector) -> Vector:
    """`vector` scaled to length 1 (so that a dot product is the cosine)."""
    norm = math.sqrt(dot(vector, vector))
    return tuple(x / norm for x in vector) if norm else vector


def dot(a: Vector, b: Vector) -> float:
    """The dot product; 0.0 for vectors of different sizes (another model's)."""
    if len(a) != len(b):
        return 0.0
    return float(sum(map(operator.mul, a, b)))  # a third of a generator's time at 1,536 dimensions


def cosine(a: Vector, b: Vector) -> float:
    """Cosine similarity; 0.0 for vectors of different sizes (another model's)."""
    return dot(unit(a), unit(b))
