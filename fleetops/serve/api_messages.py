"""`fleet serve`'s inbox endpoint: what `fleet send` does, as JSON (a gateway's webhook too).

    GET  /api/traces/{id}/messages[?mode=all|main_path]    the conversation (as before)
    POST /api/traces/{id}/messages  {content, from?, conversation_id?, interrupt?}
                                                           {"sent": id, "entry_id": ...}

The POST goes through `Fleet.send` (`fleet.conversation.messages`), so it decides nothing
the CLI does not: a trace that ended is refused with 409 (continue it instead), a message
over the caps or with a field that is no name is refused with 409/400, and nothing is
stored. Like every POST it needs the bearer token (when the service has one), the CSRF
header and a JSON body (`fleetops.serve.guard`): a gateway that pushes messages is given
both, and a request without them is refused before its body is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetops.serve import queries
from fleetops.serve.actions import ActionHandler
from fleetops.serve.app import ApiError

if TYPE_CHECKING:
    from fleet.client import Fleet

FIELDS = frozenset({"content", "from", "conversation_id", "interrupt"})


class InboxHandler(ActionHandler):
    """`GET` the trace's conversation; `POST` a message to the running trace."""

    async def get(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        mode = self.message_mode()
        self.reply(await self.call(queries.trace_messages, self.config.store, trace_id, mode))

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        data = self.fields(FIELDS)
        content = self.text(data, "content")
        sender = self.text(data, "from", required=False) or "gateway"
        conversation = self.text(data, "conversation_id", required=False) or ""
        interrupt = data.get("interrupt", False)
        if not isinstance(interrupt, bool):
            raise ApiError(400, "field 'interrupt' must be true or false")
        entry_id = await self.act(self._send, trace_id, content, sender, conversation, interrupt)
        self.reply({"sent": trace_id, "entry_id": entry_id})

    def _send(
        self, trace_id: str, content: str, sender: str, conversation: str, interrupt: bool
    ) -> str:
        return self.fleet.send(
            trace_id, content, sender=sender, conversation_id=conversation, interrupt=interrupt
        )


def routes(fleet: Fleet, base: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The inbox endpoint, for `ServeConfig.routes` (it replaces the read-only messages one)."""
    return [(r"/api/traces/([^/]+)/messages", InboxHandler, {**base, "fleet": fleet})]
