#!/bin/sh
# The analyst preset against real providers: reads the web with web_search and web_fetch,
# writes nothing, answers with a recommendation and its sources.
#
#   export OPENAI_API_KEY=sk-...      # the model (gpt-4o-mini)
#   export BRAVE_API_KEY=BSA...       # https://brave.com/search/api/ (free plan is enough)
#   examples/analyst/run.sh "Which Python HTTP client should a new async service use?"
#
# The run is inline (no Redis, no worker) in a fresh empty workspace; the config is this
# folder's fleet.yaml, which must lie outside every workspace root, so the workspace root is
# that fresh folder alone.
set -eu
: "${OPENAI_API_KEY:?set OPENAI_API_KEY (the model) and BRAVE_API_KEY (the search API)}"
: "${BRAVE_API_KEY:?set BRAVE_API_KEY (the search API, https://brave.com/search/api/)}"
here=$(cd "$(dirname "$0")" && pwd)
workspace=$(mktemp -d "${TMPDIR:-/tmp}/fleet-analyst.XXXXXX")
export FLEET_CONFIG="$here/fleet.yaml" FLEET_WORKSPACE="$workspace"
export FLEET_WORKSPACE_ROOTS="$workspace"
question=${1:-"Compare asyncio, trio and anyio for a new Python network service; cite sources."}
exec "${FLEET:-fleet}" run --inline --preset analyst --workspace "$workspace" "$question"
