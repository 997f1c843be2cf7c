"""Property tests of SSE framing: any text, any split into tokens, any split of the bytes on the
wire. A standard SSE parser (the OpenAI SDK's) reads back one event per frame, in order, whose
JSON chunks join into exactly the text, then [DONE]. Both framers are covered: `frame` (every
model) and `token_framer` (the per-token fast path the streams use)."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from api.http.sse import DONE, KEEPALIVE, event_frame, frame, token_framer
from shared.wire.chat.answers import ChatChunkChoice, ChatCompletionChunk, ChunkDelta
from shared.wire.events import TokenEvent

# Any text a model can produce: every code point but surrogates, newlines and SSE syntax included.
tokens = st.lists(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
    | st.sampled_from(["\n", "\r\n", "\r", "\n\n", "data: [DONE]\n\n", ": x\n", "\u2028", "\x00"]),
    max_size=30,
)


def chat_chunk(content: str) -> ChatCompletionChunk:
    choice = ChatChunkChoice(delta=ChunkDelta(content=content))
    return ChatCompletionChunk(id="chatcmpl-1", created=0, model="m", choices=[choice])


framed = token_framer(lambda event: chat_chunk(event.text))


def fast(content: str) -> bytes:
    return framed(TokenEvent(text=content))


def chunk(content: str) -> bytes:
    return frame(chat_chunk(content))


@st.composite
def wire(draw: st.DrawFn) -> tuple[list[str], list[bytes]]:
    """Tokens, and the stream's bytes cut anywhere (inside UTF-8 sequences too)."""
    texts = draw(tokens)
    framer = draw(st.sampled_from([chunk, fast]))
    frames = [framer(t) for t in texts]
    if frames and draw(st.booleans()):
        frames.insert(draw(st.integers(0, len(frames))), KEEPALIVE)
    data = b"".join(frames) + DONE
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=20))))
    bounds = [0, *cuts, len(data)]
    return texts, [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(stream=wire())
def test_any_text_in_any_split_reads_back_exactly(stream: tuple[list[str], list[bytes]]) -> None:
    texts, packets = stream
    events = list(SSEDecoder().iter_bytes(iter(packets)))
    assert [e.data for e in events][-1:] == ["[DONE]"]
    contents = [json.loads(e.data)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert contents == texts
    assert "".join(contents) == "".join(texts)


@settings(max_examples=200, deadline=None)
@given(text=tokens)
def test_each_frame_is_one_data_line(text: list[str]) -> None:
    for t in text:
        data = chunk(t)
        assert fast(t) == data  # the fast path writes the very same bytes
        assert data.startswith(b"data: ") and data.endswith(b"\n\n")
        body = data[len(b"data: ") : -2]
        assert b"\n" not in body and b"\r" not in body
        assert json.loads(body)["choices"][0]["delta"]["content"] == t


def test_keepalives_between_numbered_events_add_no_event() -> None:
    numbered = [event_frame("response.output_text.delta", chat_chunk(str(i)), i) for i in range(3)]
    data = KEEPALIVE + numbered[0] + KEEPALIVE + KEEPALIVE + numbered[1] + KEEPALIVE + numbered[2]
    events = list(SSEDecoder().iter_bytes(iter([data])))
    assert [(e.id, json.loads(e.data)["choices"][0]["delta"]["content"]) for e in events] == [
        ("0", "0"),
        ("1", "1"),
        ("2", "2"),
    ]
