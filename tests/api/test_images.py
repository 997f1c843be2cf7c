"""Images in, on every API, answered before anything is queued (shared/wire/images.py,
shared/queue/model_kinds.py): chat's `image_url` parts, the Responses API's `input_image` parts
and Anthropic's `image` blocks are parsed and checked (where the image is, its bytes, its
header's declared pixels, whether it decodes); a bad one is a 400 naming its part, and a good one
sent to a model that reads text only is a 400 naming the model. On the in-process app and the
session's real Redis, with a stand-in worker that announced a chat model and never takes a job:
whatever got queued would show in its lanes.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from PIL import Image
from redis import Redis

from api import create_app
from shared.queue.config import Settings
from shared.queue.jobs import LANES, GenerationJob, job_for
from shared.queue.keys import Keys
from shared.queue.model_kinds import refuse_wrong_kind
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import InvalidRequestError
from shared.wire.images import ImageLimits, check_images
from tests.api.test_model_kinds import create_batch
from tests.support import (
    MODEL,
    STAND_IN,
    ended_message_batch,
    post,
    stand_in_worker,
    taken_in,
    waiting_in,
)
from worker.runtime.liveness.heartbeat import born

LIMITS = ImageLimits(max_bytes=1 << 20, max_images=4, max_pixels=4096 * 4096)


def png(size: tuple[int, int] = (8, 8), color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def noisy_png(side: int = 64) -> bytes:
    """A PNG that does not compress away: cut short, its pixels are missing."""
    pixels = bytes((i * 7919) % 251 for i in range(side * side * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, "PNG")
    return out.getvalue()


def declaring(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header is patched to declare `width` x `height` (a decompression bomb's
    header: decoding it would take width x height x 3 bytes)."""
    raw = png((1, 1))
    fields = struct.pack(">II", width, height) + raw[24:29]  # IHDR: size, then depth and kind
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + fields))
    return raw[:16] + fields + crc + raw[33:]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# How each route carries one image, and the parameter naming it as its first message's second
# part: a data URL's (or a link's) field, or Anthropic's source fields.
def chat_body(*parts: dict[str, Any], more: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    first = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}
    return {"model": MODEL, "max_tokens": 4, "messages": [first, *(more or [])]}


def chat_image(data: bytes | None = None, url: str | None = None, **extra: Any) -> dict[str, Any]:
    link = url if url is not None else f"data:image/png;base64,{b64(data or png())}"
    return {"type": "image_url", "image_url": {"url": link, **extra}}


def responses_body(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "what is this?"}, *parts]
    return {
        "model": MODEL,
        "max_output_tokens": 16,
        "input": [{"role": "user", "content": content}],
    }


def responses_image(
    data: bytes | None = None, url: str | None = None, **extra: Any
) -> dict[str, Any]:
    link = url if url is not None else f"data:image/png;base64,{b64(data or png())}"
    return {"type": "input_image", "image_url": link, **extra}


def messages_body(*blocks: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "what is this?"}, *blocks]
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}


def messages_image(data: bytes | None = None, url: str | None = None) -> dict[str, Any]:
    if url is not None:
        return {"type": "image", "source": {"type": "url", "url": url}}
    source = {"type": "base64", "media_type": "image/png", "data": b64(data or png())}
    return {"type": "image", "source": source}


def raw_b64(route: str, text: str) -> dict[str, Any]:
    """An image part whose base64 text is `text` as it is."""
    if route == "/v1/messages":
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": text},
        }
    url = f"data:image/png;base64,{text}"
    return chat_image(url=url) if route == "/v1/chat/completions" else responses_image(url=url)


@dataclass(frozen=True)
class Api:
    """How one route carries images: its body around image parts, an image part, and the
    parameters naming the data and a link of its first message's second part."""

    path: str
    body: Callable[..., dict[str, Any]]
    image: Callable[..., dict[str, Any]]
    data_param: str
    url_param: str

    def nth(self, param: str, index: int) -> str:
        """`param` for the first message's part `index` instead."""
        return param.replace("content.1", f"content.{index}")


APIS = [
    Api(
        "/v1/chat/completions",
        chat_body,
        chat_image,
        "messages.0.content.1.image_url.url",
        "messages.0.content.1.image_url.url",
    ),
    Api(
        "/v1/responses",
        responses_body,
        responses_image,
        "input.0.content.1.image_url",
        "input.0.content.1.image_url",
    ),
    Api(
        "/v1/messages",
        messages_body,
        messages_image,
        "messages.0.content.1.source.data",
        "messages.0.content.1.source.url",
    ),
]
every_api = pytest.mark.parametrize("api", APIS, ids=["chat", "responses", "messages"])


@pytest.fixture
def fleet(redis: Redis, app_settings: Settings) -> Iterator[Keys]:
    """A live chat model, whose kind its worker announced: it reads text only."""
    keys = Keys(app_settings.namespace)
    with stand_in_worker(redis, keys, MODEL):
        born(redis, keys, STAND_IN, MODEL, "chat")
        yield keys


def client_with(app_settings: Settings, **settings: Any) -> FlaskClient:
    app: Flask = create_app(app_settings.model_copy(update={"queue_timeout_s": 3.0, **settings}))
    return app.test_client()


@pytest.fixture
def impatient(app_settings: Settings) -> FlaskClient:
    return client_with(app_settings)


def queued(redis: Redis, keys: Keys) -> int:
    return sum(waiting_in(redis, keys, MODEL, lane) for lane in LANES)


def refusal(reply: Any, path: str) -> tuple[str | None, str]:
    """A 400's parameter (None on Anthropic's routes, whose body has none) and its message, in
    the route's own error shape."""
    assert reply.status_code == 400, reply.get_data(as_text=True)
    body = reply.get_json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return None, body["error"]["message"]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["param"], body["error"]["message"]


def assert_names(reply: Any, path: str, param: str, *words: str) -> None:
    """A 400 naming `param` (in its `param` field on OpenAI's routes, in its message on
    Anthropic's), whose message says each of `words`."""
    given, message = refusal(reply, path)
    if given is not None:
        assert given == param
    else:
        assert param in message
    for word in words:
        assert word in message


@every_api
def test_a_valid_image_to_a_text_model_is_refused_naming_the_model(
    impatient: FlaskClient,
    redis: Redis,
    fleet: Keys,
    api: Api,
) -> None:
    reply = impatient.post(api.path, json=api.body(api.image(), api.image(png(color=(1, 2, 3)))))
    given, message = refusal(reply, api.path)
    assert given in ("model", None)
    assert f"'{MODEL}' does not accept images" in message
    assert queued(redis, fleet) == 0


def test_a_background_response_with_an_image_is_refused_naming_the_model(
    impatient: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    reply = impatient.post(
        "/v1/responses", json={**responses_body(responses_image()), "background": True}
    )
    assert refusal(reply, "/v1/responses")[0] == "model"
    assert queued(redis, fleet) == 0


def test_count_tokens_with_an_image_on_a_text_model_is_refused_naming_the_model(
    impatient: FlaskClient, fleet: Keys
) -> None:
    body = messages_body(messages_image())
    del body["max_tokens"]
    reply = impatient.post("/v1/messages/count_tokens", json=body)
    assert "does not accept images" in refusal(reply, "/v1/messages")[1]


def test_an_image_to_a_model_nothing_serves_is_a_404_not_an_image_refusal(
    impatient: FlaskClient, fleet: Keys
) -> None:
    reply = impatient.post(
        "/v1/chat/completions", json={**chat_body(chat_image()), "model": "nobody"}
    )
    assert reply.status_code == 404
    assert reply.get_json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("detail", ["auto", "low", "high"])
@pytest.mark.parametrize("api", APIS[:2], ids=["chat", "responses"])
def test_detail_is_accepted_and_the_request_reaches_the_model_rule(
    impatient: FlaskClient,
    fleet: Keys,
    api: Api,
    detail: str,
) -> None:
    reply = impatient.post(api.path, json=api.body(api.image(detail=detail)))
    assert "does not accept images" in refusal(reply, api.path)[1]


@every_api
@pytest.mark.parametrize("urls", ["off", "allow"])
def test_an_http_image_url_is_refused_naming_the_part(
    app_settings: Settings,
    redis: Redis,
    fleet: Keys,
    urls: str,
    api: Api,
) -> None:
    http = client_with(app_settings, image_urls=urls)
    reply = http.post(api.path, json=api.body(api.image(url="https://example.com/cat.png")))
    said = "not fetched" if urls == "off" else "not built yet"
    assert_names(reply, api.path, api.url_param, said, "data URL")
    assert queued(redis, fleet) == 0


@every_api
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not base64 at all!", "not base64"),
        (b64(b"GIF89a? no, plain text"), "not a PNG, JPEG, WebP or GIF"),
        (b64(png()[:40]), "not a PNG, JPEG, WebP or GIF"),  # cut inside its header
        (b64(noisy_png()[:300]), "does not decode"),  # cut inside its pixels
    ],
    ids=["bad-base64", "not-an-image", "cut-header", "cut-pixels"],
)
def test_corrupt_image_data_is_refused_naming_the_part(
    impatient: FlaskClient,
    redis: Redis,
    fleet: Keys,
    api: Api,
    text: str,
    said: str,
) -> None:
    reply = impatient.post(api.path, json=api.body(raw_b64(api.path, text)))
    assert_names(reply, api.path, api.data_param, said)
    assert queued(redis, fleet) == 0


@every_api
def test_more_images_than_a_request_may_carry_are_refused_naming_the_first_too_many(
    app_settings: Settings,
    fleet: Keys,
    api: Api,
) -> None:
    http = client_with(app_settings, image_max_per_request=2)
    reply = http.post(api.path, json=api.body(api.image(), api.image(), api.image()))
    third = api.nth(api.data_param, 3)
    assert_names(reply, api.path, third, "MLXQ_IMAGE_MAX_PER_REQUEST")


def test_images_are_counted_across_the_whole_conversation(
    app_settings: Settings, fleet: Keys
) -> None:
    http = client_with(app_settings, image_max_per_request=2)
    later = [
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": [chat_image(), {"type": "text", "text": "and this?"}]},
    ]
    reply = http.post(
        "/v1/chat/completions", json=chat_body(chat_image(), chat_image(), more=later)
    )
    assert_names(reply, "/v1/chat/completions", "messages.2.content.0.image_url.url", "3 images")


@every_api
def test_an_image_of_more_bytes_than_allowed_is_refused_naming_the_part(
    app_settings: Settings,
    fleet: Keys,
    api: Api,
) -> None:
    big = png((256, 256))
    http = client_with(app_settings, image_max_bytes=len(big) - 1)
    reply = http.post(api.path, json=api.body(api.image(png()), api.image(big)))
    assert_names(reply, api.path, api.nth(api.data_param, 2), "MLXQ_IMAGE_MAX_BYTES")


@every_api
@pytest.mark.parametrize("side", [20_000, 6_000])  # past Pillow's own bound, and under it
def test_a_decompression_bomb_is_refused_from_its_header_without_decoding(
    impatient: FlaskClient,
    fleet: Keys,
    monkeypatch: pytest.MonkeyPatch,
    api: Api,
    side: int,
) -> None:
    def decoded(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a bomb was decoded")

    bomb = api.body(api.image(declaring(side, side)))
    monkeypatch.setattr(Image.Image, "load", decoded)
    monkeypatch.setattr(Image.Image, "convert", decoded)
    reply = impatient.post(api.path, json=bomb)
    assert_names(reply, api.path, api.data_param, "MLXQ_IMAGE_MAX_PIXELS")


def test_a_file_id_image_in_a_response_is_refused_naming_it(
    impatient: FlaskClient, fleet: Keys
) -> None:
    reply = impatient.post(
        "/v1/responses", json=responses_body({"type": "input_image", "file_id": "file-1"})
    )
    param, message = refusal(reply, "/v1/responses")
    assert param == "input.0.content.1.file_id" and "file_id" in message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "system", "content": [chat_image()]}]},
        ),
        (
            "/v1/responses",
            {"model": MODEL, "input": [{"role": "developer", "content": [responses_image()]}]},
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [messages_image()]},
                    {"role": "user", "content": "so?"},
                ],
            },
        ),
    ],
    ids=["chat", "responses", "messages"],
)
def test_only_a_user_message_carries_images(
    impatient: FlaskClient, fleet: Keys, path: str, body: dict[str, Any]
) -> None:
    _, message = refusal(impatient.post(path, json=body), path)
    assert "image" in message


def test_a_data_url_of_another_media_type_is_refused_naming_the_part(
    impatient: FlaskClient, fleet: Keys
) -> None:
    part = chat_image(url=f"data:image/tiff;base64,{b64(png())}")
    reply = impatient.post("/v1/chat/completions", json=chat_body(part))
    assert_names(reply, "/v1/chat/completions", "messages.0.content.1.image_url.url", "image/tiff")


# The rule itself, without the app.


def test_a_chat_job_carries_its_images_checked_in_order_with_their_content_ids() -> None:
    req = ChatCompletionRequest.model_validate(
        chat_body(chat_image(png(color=(1, 1, 1)), detail="low"), chat_image(png(color=(2, 2, 2))))
    )
    images = check_images(req.images(), LIMITS)
    job = job_for("chatcmpl-1", req, images=images)
    assert [i.content_id for i in job.images] == [i.content_id for i in images]
    assert len({i.content_id for i in images}) == 2
    assert job.has_images
    again = GenerationJob.model_validate_json(job.model_dump_json())  # as the worker reads it
    assert again.images == job.images and again.has_images


def test_a_job_with_images_is_refused_on_every_kind_of_model_as_none_reads_images_yet() -> None:
    req = ChatCompletionRequest.model_validate(chat_body(chat_image()))
    job = job_for("chatcmpl-1", req)  # a batch line's job: its images not checked, still seen
    for kind in (None, "chat"):
        with pytest.raises(InvalidRequestError, match="does not accept images") as refused:
            refuse_wrong_kind(job, kind)
        assert refused.value.param == "model"
    refuse_wrong_kind(
        job_for("chatcmpl-2", ChatCompletionRequest.model_validate(chat_body())), None
    )


def test_a_batch_line_with_an_image_ends_at_once_as_an_error_line_naming_the_model(
    http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    body = chat_body(chat_image())
    lines = [{"custom_id": "seen", "method": "POST", "url": "/v1/chat/completions", "body": body}]
    batch = create_batch(http, redis, fleet, lines)
    assert batch["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    content = http.get(f"/v1/files/{batch['error_file_id']}/content").get_data(as_text=True)
    error = json.loads(content)["response"]["body"]["error"]
    assert error["param"] == "model" and "does not accept images" in error["message"]
    assert queued(redis, fleet) == 0


def test_a_message_batch_request_with_an_image_ends_errored_naming_the_model(
    http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    params = messages_body(messages_image())
    created = http.post(
        "/v1/messages/batches", json={"requests": [{"custom_id": "m", "params": params}]}
    )
    assert created.status_code == 200, created.get_data(as_text=True)
    taken_in(redis, fleet, created.get_json()["id"])
    ended_message_batch(http, created.get_json()["id"])  # finalized in a process of its own
    results = http.get(f"/v1/messages/batches/{created.get_json()['id']}/results")
    (result,) = [json.loads(line) for line in results.get_data(as_text=True).splitlines()]
    assert result["result"]["type"] == "errored"
    assert "does not accept images" in json.dumps(result["result"]["error"])
    assert queued(redis, fleet) == 0


def test_under_gunicorn_images_are_checked_off_the_hub_and_a_refusal_logs_no_traceback(
    api_url: str, logs: Path
) -> None:
    """The session's API runs gevent workers, where the checks run on the hub's native threads
    (api/http/validation.py): a refusal comes back as the same 400, and nothing is logged."""
    bad = post(api_url, "/v1/chat/completions", chat_body(raw_b64("/v1/chat/completions", "!!")))
    assert bad.status == 400, bad.body
    assert bad.body["error"]["param"] == "messages.0.content.1.image_url.url"
    good = post(api_url, "/v1/chat/completions", chat_body(chat_image()))
    assert good.status in (400, 404), good.body  # no model reads images, or none is served
    assert good.body["error"]["param"] == "model"
    assert "failed with InvalidRequestError" not in (logs / "api.log").read_text()
