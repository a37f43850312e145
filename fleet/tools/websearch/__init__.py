"""`web_search`: one query to the operator's search provider, results filtered and bounded.

- `config`: the `search:` block of fleet.yaml (imported by `fleet.llm.config`: keep it light).
- `results`: what a search returns, normalised and cleaned of markup and control characters.
- `providers`: the `SearchProvider` protocol and the providers by name.
- `searxng`, `brave`: one module per wire format; a third provider is a module like them.
- `http`: the one guarded GET (SSRF guard, byte cap, deadline) every provider goes through.
- `service`: a fleet's search: budget per tree, provider limits, the key, the call.
- `tool`: the `web_search` tool function.
"""
