"""Model calls through the providers' Batch APIs: half the price, answers within hours.

A tree submitted with `batch_api` does not call its provider from a worker: each model
turn is queued (`route.park`, the queue in `fleet.storage.batch_calls`) and its trace waits
with a `{type: batch}` collaborator, holding no slot and no lease. One poller per fleet
(`poller.poll_once`, run by a Celery task behind a Redis claim in `workers/`) sends the
queued calls as provider batches (`providers`: OpenAI's `/v1/batches`, Anthropic's
`/v1/messages/batches`; `http` reads every answer capped, `lines` an output file as
capped strict-JSON lines, a hostile line being its call's error), fetches finished ones
and returns the traces to resume; the resumed turn consumes the stored answer
(`route.consume`) instead of calling the model.

Imports: llm, limits, storage, runtime and lifecycle; nothing that runs a trace.
"""
