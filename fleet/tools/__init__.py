"""Tools: a registry built from typed functions, file/shell/web/skill tools.

A tool reaches the store only through a role it is handed (`imagecheck.TreeImages`,
`websearch.cache.AnswerCache`), never the storage package (tests/test_imports.py); the
schemas of its fleet.yaml blocks (`web:`, `search:`, the shell's limits) are `fleet.config`'s.
"""
