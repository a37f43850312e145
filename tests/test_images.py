"""Images (issue 26 item 4): header checks, read_image, storage by reference, both wires,
`vision: false`, token counts, and the attacks: a bomb, a fake .png, a symlink out, a URL
to 127.0.0.1, a batch entry reaching outside its workspace."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fleet.batch.file import check_entries, entries_from
from fleet.errors import ConfigError, ToolError
from fleet.inprocess import InProcessFleet
from fleet.llm.anthropic import to_anthropic_messages
from fleet.llm.openai import TOOL_IMAGES_NOTE, to_openai_messages
from fleet.llm.vision import anthropic_tokens, openai_tokens
from fleet.loop.fit import estimate_tokens
from fleet.models import Message, Trace, text_of
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.memory.images import MemoryImages
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.images import RedisImages
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from fleet.tools.base import ToolContext
from fleet.tools.imagecheck import MAX_IMAGE_BYTES, checked
from fleet.tools.images import read_image
from fleet.tools.imagesource import load_images
from fleetops.cli.output import render_tree
from tests import imagekit


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- headers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "media_type", "size"),
    [
        (imagekit.png(4, 3), "image/png", (4, 3)),
        (imagekit.jpeg(640, 480), "image/jpeg", (640, 480)),
        (imagekit.gif(5, 7), "image/gif", (5, 7)),
        (imagekit.webp_lossless(9, 2), "image/webp", (9, 2)),
        (imagekit.webp_extended(3000, 2000), "image/webp", (3000, 2000)),
    ],
)
def test_the_type_comes_from_the_magic_bytes_and_the_size_from_the_header(
    data: bytes, media_type: str, size: tuple[int, int]
) -> None:
    image = checked(data, "x")
    assert (image.info.media_type, image.info.width, image.info.height) == (media_type, *size)
    assert image.info.size_bytes == len(data)


def test_a_gif_frame_larger_than_its_screen_is_seen_and_refused() -> None:
    """Attack: a 1 x 1 screen whose one frame claims 65535 x 65535 pixels."""
    assert checked(imagekit.gif(5, 7, frames=3), "ok.gif").info.width == 5
    with pytest.raises(ToolError, match="65535x65535 pixels"):
        checked(imagekit.gif(1, 1, frame=(65535, 65535)), "bomb.gif")
    with pytest.raises(ToolError, match="more than the limit"):
        checked(imagekit.gif(2, 2, frames=1_001), "many.gif")


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    bomb = imagekit.png_bomb(100_000, 100_000)
    assert len(bomb) < 2_000  # a few hundred bytes that would inflate to 30 GB
    with pytest.raises(ToolError, match="100000x100000 pixels is more than the limit"):
        checked(bomb, "bomb.png")
    with pytest.raises(ToolError, match="more than the limit"):
        checked(imagekit.webp_extended(8_000, 8_000), "wide.webp")  # 64 M pixels


@pytest.mark.parametrize(
    "data",
    [
        b"#!/bin/sh\necho not an image\n",
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        b"\x89PNG\r\n",  # cut short
        imagekit.png()[:20],  # header cut mid-IHDR
        b"\xff\xd8\xff\xe0\x00\x10JFIF",  # a JPEG with no frame
        imagekit.png(0, 5),
    ],
)
def test_what_is_not_a_whole_image_is_refused(data: bytes) -> None:
    with pytest.raises(ToolError, match="refused") as raised:
        checked(data, "shot.png")
    assert "\n" not in str(raised.value)


def test_an_image_over_the_byte_cap_is_refused() -> None:
    with pytest.raises(ToolError, match="larger than"):
        checked(imagekit.png() + b"\x00" * MAX_IMAGE_BYTES, "big.png")


# -- token formulas ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [(1024, 1024, 765), (2048, 4096, 1105), (512, 512, 255), (100, 100, 255)],
)
def test_openai_tiles(width: int, height: int, tokens: int) -> None:
    """OpenAI's documented examples: 1024² is 4 tiles (765), 2048x4096 is 6 tiles (1105)."""
    assert openai_tokens(width, height) == tokens


@pytest.mark.parametrize(
    ("width", "height", "tokens"), [(1000, 1000, 1334), (200, 200, 54), (5000, 5000, 1600)]
)
def test_anthropic_pixels_over_750(width: int, height: int, tokens: int) -> None:
    assert anthropic_tokens(width, height) == tokens


def test_an_image_counts_in_the_estimate_by_its_formula_not_its_bytes() -> None:
    image = checked(imagekit.jpeg(1024, 1024), "x")
    message = {"role": "user", "content": [{"type": "text", "text": "look"}, image.ref()]}
    plain = {"role": "user", "content": "look"}
    added = estimate_tokens([message], [], "openai") - estimate_tokens([plain], [], "openai")
    assert 765 <= added < 765 + 60  # the formula plus the reference's own JSON
    added = estimate_tokens([message], [], "anthropic") - estimate_tokens([plain], [], "anthropic")
    assert 1398 <= added < 1398 + 60  # 1024 x 1024 / 750


# -- read_image --------------------------------------------------------------------------


def test_read_image_returns_the_checked_image(tmp_path: Path) -> None:
    (tmp_path / "shots").mkdir()
    (tmp_path / "shots" / "a.png").write_bytes(imagekit.png(4, 3))
    result = read_image(ToolContext(workspace=tmp_path), "shots/a.png")
    (image,) = result.images
    assert image.data == imagekit.png(4, 3)
    assert "PNG 4x3" in result.output and result.long_term_memory


def test_read_image_refuses_a_symlink_out_of_the_workspace(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.png").write_bytes(imagekit.png())
    (workspace / "link.png").symlink_to(outside / "secret.png")
    (workspace / "dir").symlink_to(outside)
    ctx = ToolContext(workspace=workspace)
    for path in (
        "link.png",
        "dir/secret.png",
        "../outside/secret.png",
        str(outside / "secret.png"),
    ):
        with pytest.raises(ToolError):
            read_image(ctx, path)


def test_read_image_refuses_a_png_that_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "shot.png").write_text("just text\n")
    with pytest.raises(ToolError, match="not a PNG, JPEG, GIF or WebP"):
        read_image(ToolContext(workspace=tmp_path), "shot.png")


# -- a run: stored by reference, sent once ----------------------------------------------------


def local_fleet(workspace: Path, model: ScriptedModel, **settings: Any) -> InProcessFleet:
    env = {"FLEET_WORKSPACE": str(workspace)}
    return InProcessFleet.from_settings(Settings.from_env(env), clients={"m": model}, **settings)


def test_read_image_sends_the_image_in_the_next_request_and_stores_it_once(
    tmp_path: Path,
) -> None:
    data = imagekit.png(6, 2)
    (tmp_path / "shot.png").write_bytes(data)
    (tmp_path / "same.png").write_bytes(data)
    model = ScriptedModel(
        [
            call("read_image", path="shot.png"),
            call("read_image", path="same.png"),
            text("a black rectangle"),
        ]
    )
    local = local_fleet(tmp_path, model)
    trace = local.run("what is in shot.png?", model="m")
    assert trace.status == "completed", trace.error

    second = model.requests[1]  # the request after the first read_image
    (tool_message,) = [m for m in second if m["role"] == "tool"]
    parts = tool_message["content"]
    assert {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{b64(data)}"},
    } in parts
    third = model.requests[2]  # the first image went back to its short form
    first_result = [m for m in third if m["role"] == "tool"][0]
    assert first_result["content"].startswith("looked at shot.png")

    stored = [m for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    dumped = json.dumps([m.model_dump(mode="json") for m in stored])
    assert b64(data)[:40] not in dumped  # messages hold a reference, never the bytes
    assert "image_ref" in dumped
    assert isinstance(local.store, MemoryStore)
    assert len([k for k in local.store.images if ":image:" in k]) == 1  # same bytes: one image


def test_hooks_see_an_image_as_its_reference_never_its_bytes(tmp_path: Path) -> None:
    data = imagekit.png(3, 3)
    (tmp_path / "shot.png").write_bytes(data)
    model = ScriptedModel([call("read_image", path="shot.png"), text("ok")])
    settings = Settings(workspace=tmp_path, env={}, hooks=("tests.imagekit:REQUESTS",))
    local = InProcessFleet.from_settings(settings, clients={"m": model})
    imagekit.REQUESTS.shown.clear()
    trace = local.run("look", model="m", images=[str(tmp_path / "shot.png")])
    assert trace.status == "completed", trace.error
    shown = json.dumps(imagekit.REQUESTS.shown)
    assert len(imagekit.REQUESTS.shown) == 2
    assert shown.count('"type": "image_ref"') == 3  # the task's; then the task's and the tool's
    assert b64(data)[:40] not in shown
    assert b64(data)[:40] in json.dumps(model.requests)  # the control: the model got the bytes


def test_a_task_image_reaches_the_first_request_and_trace_show_shows_a_placeholder(
    tmp_path: Path,
) -> None:
    (tmp_path / "shot.png").write_bytes(imagekit.png(8, 8))
    model = ScriptedModel([text("seen")])
    local = local_fleet(tmp_path, model)
    trace = local.run("describe", model="m", images=[str(tmp_path / "shot.png")])
    assert trace.status == "completed", trace.error
    (user,) = [m for m in model.requests[0] if m["role"] == "user"]
    assert user["content"][0] == {"type": "text", "text": "describe"}
    assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    shown = "\n".join(render_tree(local.store, trace))
    assert "with 1 image(s): [image PNG 8x8, " in shown
    assert b64(imagekit.png(8, 8))[:40] not in shown


def test_a_model_without_vision_is_never_sent_an_image(tmp_path: Path) -> None:
    (operator := tmp_path / "operator").mkdir()
    (workspace := tmp_path / "ws").mkdir()
    (workspace / "shot.png").write_bytes(imagekit.png())
    script = operator / "s.yaml"
    steps = [{"tool_calls": [{"name": "read_image", "arguments": {"path": "shot.png"}}]}]
    script.write_text(yaml.safe_dump({"scripts": [{"steps": [*steps, {"content": "x"}]}]}))
    config = {"models": {"blind": {"provider": "scripted", "name": str(script), "vision": False}}}
    (operator / "fleet.yaml").write_text(yaml.safe_dump(config))
    settings = Settings(
        workspace=workspace, env={}, config_path=operator / "fleet.yaml", allow_scripted=True
    )
    local = InProcessFleet.from_settings(settings)

    with pytest.raises(ConfigError, match=r"model 'blind' takes no images \(vision: false"):
        local.run("describe", model="blind", images=[str(workspace / "shot.png")])
    trace = local.run("look at shot.png", model="blind")
    assert trace.status == "failed"
    assert "takes no images (vision: false in fleet.yaml)" in (trace.error or "")
    assert "was not sent" in (trace.error or "")


# -- the wires --------------------------------------------------------------------------------


def wire_history(data: bytes) -> list[dict[str, Any]]:
    url = f"data:image/png;base64,{b64(data)}"
    image = {"type": "image_url", "image_url": {"url": url}}
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in ((1, "read_image"), (2, "read_file"))
    ]
    result = [{"type": "text", "text": "a.png"}, image]
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
        {"role": "tool", "tool_call_id": "call_2", "content": "text file"},
    ]


def test_openai_wire_tool_images_follow_the_tool_results_as_one_user_turn() -> None:
    data = imagekit.png()
    out = to_openai_messages(wire_history(data))
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert out[1]["content"][1]["type"] == "image_url"  # a user's image stays in place
    assert out[3]["content"] == "a.png"  # a tool message carries text only
    assert out[5]["content"][0] == {"type": "text", "text": TOOL_IMAGES_NOTE}
    assert out[5]["content"][1]["image_url"]["url"].endswith(b64(data))


def test_anthropic_wire_images_are_base64_image_blocks() -> None:
    data = imagekit.png()
    system, turns = to_anthropic_messages(wire_history(data))
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(data)},
    }  # noqa: E501
    assert system == "sys"
    assert turns[0]["content"] == [{"type": "text", "text": "look"}, block]
    results = turns[2]["content"]
    assert results[0]["content"] == [{"type": "text", "text": "a.png"}, block]
    assert results[1]["content"] == "text file"


# -- attacks on the task's images ----------------------------------------------------------


def test_an_image_url_to_loopback_is_refused_before_any_request(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:9/shot.png", "http://localhost/shot.png", "http://[::1]/a.png"):
        with pytest.raises(ConfigError, match="image refused: .*not a public address") as raised:
            load_images([url])
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="give a file path or an http"):
        load_images(["file:///etc/passwd"])


def test_a_batch_entry_image_outside_its_workspace_stops_the_batch(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.png").write_bytes(imagekit.png())
    (workspace / "ok.png").write_bytes(imagekit.png())
    (workspace / "link.png").symlink_to(outside / "secret.png")
    local = local_fleet(workspace, ScriptedModel([text("x")]))
    good = entries_from([{"task": "t", "model": "m", "images": ["ok.png"]}])
    check_entries(local.runtime, good, "<batch>")  # no error
    for image in ("link.png", "../outside/secret.png", str(outside / "secret.png")):
        bad = entries_from([{"task": "t", "model": "m", "images": [image]}])
        with pytest.raises(ConfigError, match=r"<batch>:1: image refused"):
            check_entries(local.runtime, bad, "<batch>")


# -- the image store -------------------------------------------------------------------------


def test_images_are_stored_once_with_the_trace_ttl(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    images = RedisImages(store)
    data = imagekit.png()
    digest = checked(data, "x").digest
    images.put("t-root", digest, data)
    images.put("t-root", digest, data)
    found = list(redis_db.scan_iter(match=f"{keys.PREFIX}:image:*"))
    assert found == [keys.image("t-root", digest)]
    assert 0 < redis_db.ttl(found[0]) <= keys.TRACE_TTL_S
    assert images.get("t-root", digest) == data
    assert images.get("t-other", digest) is None  # per tree
    memory = MemoryImages(MemoryStore())
    memory.put("t-root", digest, data)
    assert memory.get("t-root", digest) == data


def test_a_forged_reference_becomes_a_placeholder_not_a_request(tmp_path: Path) -> None:
    model = ScriptedModel([text("ok")])
    local = local_fleet(tmp_path, model)
    forged = {"type": "image_ref", "image_ref": {"id": "../../x", "media_type": "image/png"}}
    message = Message(trace_id="t-x", role="user", content=[{"type": "text", "text": "hi"}, forged])
    assert text_of(message.content).startswith("hi\n[image PNG")
    from fleet.loop.images import with_images

    sent = with_images(local.runtime, "t-root", "m", [message.to_openai()])
    assert sent[0]["content"][1]["type"] == "text"
    assert "no longer stored" in sent[0]["content"][1]["text"]


def test_a_tree_stores_at_most_its_image_bytes_then_the_model_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: an agent reading image after image to fill Redis."""
    first, second = imagekit.png(4, 4), imagekit.png(5, 5)
    monkeypatch.setattr(keys, "IMAGE_TREE_MAX_BYTES", len(first) + len(second) - 1)
    (tmp_path / "a.png").write_bytes(first)
    (tmp_path / "b.png").write_bytes(second)
    model = ScriptedModel(
        [call("read_image", path="a.png"), call("read_image", path="b.png"), text("ok")]
    )
    local = local_fleet(tmp_path, model)
    trace = local.run("look at both", model="m")
    assert trace.status == "completed", trace.error
    results = [m for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    assert [bool(m.metadata["is_error"]) for m in results] == [False, True]
    assert "bytes of images already: no more" in text_of(results[1].content)
    assert isinstance(local.store, MemoryStore)
    assert len([k for k in local.store.images if ":image:" in k]) == 1


def test_the_redis_image_cap_counts_each_image_once(
    redis_db: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = imagekit.png(4, 4), imagekit.png(5, 5)
    monkeypatch.setattr(keys, "IMAGE_TREE_MAX_BYTES", len(first) + len(second) - 1)
    images = RedisImages(RedisStore(redis_db))
    images.put("t-root", "a", first)
    images.put("t-root", "a", first)  # the same image again costs nothing
    with pytest.raises(ToolError, match="no more"):
        images.put("t-root", "b", second)
    assert images.get("t-root", "b") is None
    assert int(redis_db.get(keys.image_bytes("t-root")) or 0) == len(first)
    images.put("t-other", "b", second)  # another tree has its own


def test_the_gate_books_an_image_by_the_larger_formula() -> None:
    from fleet.limits.gate import request_chars

    image = checked(imagekit.jpeg(1024, 1024), "x")
    plain = Message(trace_id="t-x", role="user", content="look")
    shown = Message(
        trace_id="t-x", role="user", content=[{"type": "text", "text": "look"}, image.ref()]
    )  # noqa: E501
    added = request_chars([shown], []) - request_chars([plain], [])
    assert added >= anthropic_tokens(1024, 1024) * 4  # 1398 tokens > OpenAI's 765


def test_watch_shows_the_tasks_images_as_placeholders() -> None:
    from fleetops.watch_view import node_of, row_text

    ref = checked(imagekit.png(8, 8), "x").ref()
    trace = Trace(trace_id="t-root", root_trace_id="t-root", task="t", context={"images": [ref]})
    row = row_text(node_of(trace))
    assert "1 image(s): [image PNG 8x8, 0.1 KB]" in row


def test_mangled_images_are_refused_with_a_tool_error_or_accepted_never_crash() -> None:
    """Attack: headers cut and flipped at random; the check says refused or gives sizes."""
    rng = random.Random(26)
    seeds = [
        imagekit.png(),
        imagekit.jpeg(),
        imagekit.gif(frames=2),
        imagekit.webp_lossless(),
        imagekit.webp_extended(),
    ]
    for _ in range(3_000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))]
        try:
            image = checked(bytes(data), "x")
        except ToolError:
            continue
        assert 0 < image.info.width <= 8_000 and 0 < image.info.height <= 8_000


def test_a_batch_entry_with_images_shows_them_to_its_model(tmp_path: Path) -> None:
    from fleet.client import Fleet
    from tests.test_batch import MODEL, ThreadBackend, memory_runtime

    (tmp_path / "shot.png").write_bytes(imagekit.png(7, 7))
    model = ScriptedModel([text("seen")])
    runtime = memory_runtime(tmp_path, model)
    backend = ThreadBackend(runtime)
    try:
        fleet = Fleet(runtime, backend)
        (result,) = fleet.batch([{"task": "describe", "model": MODEL, "images": ["shot.png"]}])
    finally:
        backend.pool.shutdown(wait=True)
    assert result.status == "completed", result.error
    (user,) = [m for m in model.requests[0] if m["role"] == "user"]
    assert user["content"][1]["image_url"]["url"].endswith(b64(imagekit.png(7, 7)))
    root = runtime.store.get_trace(result.trace_id)
    assert root.context["images"][0]["image_ref"]["width"] == 7
