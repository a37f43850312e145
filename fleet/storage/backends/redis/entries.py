r"""A collaborator entry rewritten in Lua keeps the fields this release does not know.

An entry is rebuilt from its child at every status change (`fleet.lifecycle.entries.mirrored`),
so the entry a script writes would drop a field a newer release added to the one it
replaces. `KEEP` splices those fields back, raw: each top-level field of the stored entry
that the new one lacks and `Collaborator` does not declare is appended as its bytes were
written (never through cjson, which turns `[]` into `{}` and big integers into floats).
`schema_version` is the writer's own: the kept fields are a newer release's, read by it
again. The stored entry's names are read by cjson first (an entry with none to keep, the
usual case, costs an HGET and that decode: ~7 µs of Redis CPU per entry write, measured
on a 700-byte entry); only one with a stranger is scanned raw.
"""

from __future__ import annotations

from fleet.models import Collaborator

_KNOWN = ", ".join(f"['\"{name}\"'] = true" for name in Collaborator.model_fields)

KEEP = (
    r"""
-- The index just past the JSON value that starts at `i` of `s`.
local function json_end(s, i)
  local c = string.sub(s, i, i)
  if c == '"' then
    local j = i + 1
    while true do
      local p = string.find(s, '["\\]', j)
      if string.sub(s, p, p) == '"' then return p + 1 end
      j = p + 2
    end
  elseif c == '{' or c == '[' then
    local depth, j = 0, i
    while true do
      local p = string.find(s, '["{}%[%]]', j)
      local d = string.sub(s, p, p)
      if d == '"' then j = json_end(s, p) else
        if d == '{' or d == '[' then depth = depth + 1 else depth = depth - 1 end
        j = p + 1
        if depth == 0 then return j end
      end
    end
  end
  return string.find(s, '[,}%]%s]', i) or #s + 1
end
-- The top-level fields of a JSON object, raw: {key with its quotes, value text}, in order.
local function json_fields(s)
  local found, i = {}, string.find(s, '{', 1, true) + 1
  while true do
    local k = string.find(s, '[^%s,]', i)
    if not k or string.sub(s, k, k) ~= '"' then return found end
    local after = json_end(s, k)
    local v = string.find(s, '[^%s:]', after)
    i = json_end(s, v)
    found[#found + 1] = {string.sub(s, k, after - 1), string.sub(s, v, i - 1)}
  end
end
local KNOWN_ENTRY_FIELDS = {"""
    + _KNOWN
    + r"""}
-- `entry` (JSON), with the fields of `old` (the entry it replaces, or false) that it lacks
-- and this release does not know, appended as they were written.
local function kept(entry, old)
  if not old then return entry end
  -- The names only, at C speed (the values are taken raw); anything cjson refuses (nested
  -- deeper than it reads) is looked at raw.
  local read, decoded = pcall(cjson.decode, old)
  local strangers = not read
  for key in pairs(read and decoded or {}) do
    if not KNOWN_ENTRY_FIELDS['"' .. key .. '"'] then strangers = true end
  end
  if not strangers then return entry end
  local mine, more = {}, {}
  for _, f in ipairs(json_fields(entry)) do mine[f[1]] = true end
  for _, f in ipairs(json_fields(old)) do
    local key = f[1]
    if not KNOWN_ENTRY_FIELDS[key] and not mine[key] then more[#more + 1] = key .. ':' .. f[2] end
  end
  if #more == 0 then return entry end
  local body = string.sub(entry, 1, string.find(entry, '}%s*$') - 1)
  return body .. ',' .. table.concat(more, ',') .. '}'
end
"""
)
"""Lua defining `kept(entry, old)`: the new entry's JSON with the old one's unknown fields."""

# A collaborator entry on its own (a person's, a finish outside a runner): atomic per child.
# KEYS: collaborators, collaborator order[, events]
# ARGV: ttl_s, child trace id, Collaborator JSON[, events maxlen, event JSON: with KEYS[3]]
PUT_COLLABORATOR = (
    KEEP
    + """
local entry = kept(ARGV[3], redis.call('HGET', KEYS[1], ARGV[2]))
if redis.call('HSET', KEYS[1], ARGV[2], entry) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
end
if KEYS[3] then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'e', ARGV[5]) end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ARGV[1]) end
"""
)
