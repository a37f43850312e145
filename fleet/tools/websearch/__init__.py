"""`web_search`: one query to the operator's search provider, results filtered and bounded.

- `config`: the `search:` block of fleet.yaml (imported by `fleet.llm.config`: keep it light).
- `results`: what a search returns, normalised and cleaned of markup and control characters.
- `providers`: the `SearchProvider` protocol a wire format implements.
- `searxng`, `brave`: one module per wire format; a third provider is a module like them.
- `http`: the one guarded GET (SSRF guard, byte cap, deadline) every provider goes through.
- `service`: a fleet's search: the providers by name, budget per tree, provider limits, the key.
- `tool`: the `web_search` tool function.
"""
