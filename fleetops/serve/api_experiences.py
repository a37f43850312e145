"""`fleet serve`'s experience endpoints: what `fleet experience` does, as JSON.

    GET  /api/experiences[?scope=SCOPE&approved=0|1]   {"experiences": [...]}
    POST /api/experiences  {scope, condition, rule, proposed?}  201 {"experience": {...}}
    GET  /api/experiences/{id}                         {"experience": {...}}
    POST /api/experiences/{id}/approve  {}             {"experience": {...}}
    POST /api/experiences/{id}/remove   {}             {"removed": id}

A person adding a rule through the API is `source: manual`, approved unless `proposed`, as
with the CLI. The store is the fleet client's, so an approved experience is embedded when
fleet.yaml names an embedding model (`fleet.experiences.embedding`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fleet.experiences.model import Experience, check_scope, new_experience
from fleetops.serve.actions import ActionHandler
from fleetops.serve.app import ApiError

if TYPE_CHECKING:
    from fleet.client import Fleet

EXPERIENCE_ID = re.compile(r"exp-[A-Za-z0-9_-]{1,64}")
ADD_FIELDS = frozenset({"scope", "condition", "rule", "proposed"})


def as_json(experience: Experience) -> dict[str, Any]:
    """The experience as the API shows it: every field, and its success rate."""
    return {**experience.model_dump(mode="json"), "success_rate": experience.success_rate}


class _ExperienceBase(ActionHandler):
    def experience_id(self, raw: str) -> str:
        if not EXPERIENCE_ID.fullmatch(raw):
            raise ApiError(400, f"experience id {raw[:80]!r} is not like exp-0123456789ab")
        return raw


class ExperiencesHandler(_ExperienceBase):
    """`GET /api/experiences`, `POST /api/experiences`."""

    async def get(self) -> None:
        unknown = sorted(set(self.request.query_arguments) - {"scope", "approved"})
        if unknown:
            raise ApiError(400, f"unknown query argument(s) {unknown!r}")
        scope = self.get_query_argument("scope", None)
        approved = self.get_query_argument("approved", None)
        if scope is not None:
            await self.act(check_scope, scope)
        if approved not in (None, "0", "1"):
            raise ApiError(400, "approved must be 0 or 1")
        found = await self.act(self.fleet.experiences.all, scope)
        if approved is not None:
            found = [e for e in found if e.approved == (approved == "1")]
        self.reply({"experiences": [as_json(e) for e in found]})

    async def post(self) -> None:
        data = self.fields(ADD_FIELDS)
        proposed = data.get("proposed", False)
        if not isinstance(proposed, bool):
            raise ApiError(400, "field 'proposed' must be true or false")
        texts = [self.text(data, name) for name in ("scope", "condition", "rule")]
        experience = await self.act(_add, self.fleet, *texts, not proposed)
        self.set_status(201)
        self.reply({"experience": as_json(experience)})


class ExperienceHandler(_ExperienceBase):
    """`GET /api/experiences/{id}`."""

    async def get(self, raw_id: str) -> None:
        found = await self.act(self.fleet.experiences.get, self.experience_id(raw_id))
        self.reply({"experience": as_json(found)})


class ApproveExperienceHandler(_ExperienceBase):
    """`POST /api/experiences/{id}/approve`: runs of its scope may be shown it."""

    async def post(self, raw_id: str) -> None:
        self.fields(frozenset())
        approved = await self.act(_approve, self.fleet, self.experience_id(raw_id))
        self.reply({"experience": as_json(approved)})


class RemoveExperienceHandler(_ExperienceBase):
    """`POST /api/experiences/{id}/remove`: forget it (404 if there is none)."""

    async def post(self, raw_id: str) -> None:
        self.fields(frozenset())
        experience_id = self.experience_id(raw_id)
        await self.act(_remove, self.fleet, experience_id)
        self.reply({"removed": experience_id})


def _add(fleet: Fleet, scope: str, condition: str, rule: str, approved: bool) -> Experience:
    experience = new_experience(scope, condition, rule, source="manual", approved=approved)
    fleet.experiences.put(experience)
    return fleet.experiences.get(experience.id)


def _approve(fleet: Fleet, experience_id: str) -> Experience:
    experience = fleet.experiences.get(experience_id)
    experience.approved = True
    fleet.experiences.put(experience)
    return experience


def _remove(fleet: Fleet, experience_id: str) -> None:
    fleet.experiences.get(experience_id)  # ExperienceNotFound: 404
    fleet.experiences.remove(experience_id)


def routes(fleet: Fleet, base: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The experience endpoints, for `ServeConfig.routes`."""
    kwargs = {**base, "fleet": fleet}
    return [
        (r"/api/experiences", ExperiencesHandler, kwargs),
        (r"/api/experiences/([^/]+)", ExperienceHandler, kwargs),
        (r"/api/experiences/([^/]+)/approve", ApproveExperienceHandler, kwargs),
        (r"/api/experiences/([^/]+)/remove", RemoveExperienceHandler, kwargs),
    ]
