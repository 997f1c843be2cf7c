"""A reasoning model's reasoning in every API's answer, built from the job's events: chat's
`reasoning_content` and `reasoning`, Anthropic's thinking block with its signature, and the
Responses API's reasoning item before the message."""

from __future__ import annotations

from shared.wire.anthropic.message_answers import MessageStream, message
from shared.wire.chat.answers import Transcripts, chat_completion
from shared.wire.chat.completions import ChatCompletionRequest, CompletionTokensDetails, Usage
from shared.wire.events import DoneEvent, Event, StartedEvent, TokenEvent
from shared.wire.responses.reasoning_blob import decode_reasoning_blob
from shared.wire.responses.response_events import ResponseStream
from shared.wire.responses.response_state import Progress, render
from shared.wire.responses.responses import ResponsesRequest, StoredResponse

USAGE = Usage(
    prompt_tokens=5,
    completion_tokens=4,
    total_tokens=9,
    completion_tokens_details=CompletionTokensDetails(reasoning_tokens=2),
)
DONE = DoneEvent(finish_reason="stop", usage=USAGE)
THOUGHT = [TokenEvent(text="", reasoning="Two plus"), TokenEvent(text="", reasoning=" two.")]
ANSWER = [TokenEvent(text="It is"), TokenEvent(text=" 4.")]


def completion_of(events: list[TokenEvent]) -> dict[str, object]:
    got = Transcripts()
    for event in events:
        got.add(event)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "2+2?"}])
    return chat_completion(req, "chatcmpl-1", 1, got, DONE).model_dump(mode="json")


def test_chat_puts_the_reasoning_under_both_names_and_the_answer_in_content() -> None:
    body = completion_of([*THOUGHT, *ANSWER])
    message = body["choices"][0]["message"]  # type: ignore[index]
    assert message["content"] == "It is 4."
    assert message["reasoning_content"] == message["reasoning"] == "Two plus two."
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2  # type: ignore[index]


def test_chat_leaves_both_reasoning_fields_out_when_the_model_did_not_reason() -> None:
    message = completion_of(ANSWER)["choices"][0]["message"]  # type: ignore[index]
    assert "reasoning_content" not in message and "reasoning" not in message


def test_anthropic_streams_a_signed_thinking_block_before_the_text() -> None:
    stream = MessageStream("msg_1", "m")
    events = [e for token in [*THOUGHT, *ANSWER] for e in stream.feed(token)]
    events += stream.closing(DONE)
    shown = [e.model_dump(mode="json") for e in events]
    kinds = [(e["type"], e.get("delta", {}).get("type")) for e in shown]
    assert kinds[:5] == [
        ("content_block_start", None),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    assert shown[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    signature = shown[3]["delta"]["signature"]
    assert signature and decode_reasoning_blob(signature) == "Two plus two."
    assert shown[5]["content_block"]["type"] == "text" and shown[5]["index"] == 1


def test_anthropic_message_body_opens_with_the_thinking_block() -> None:
    got = Transcripts()
    for event in [*THOUGHT, *ANSWER]:
        got.add(event)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "2+2?"}])
    body = message(chat_completion(req, "msg_1", 1, got, DONE), DONE).model_dump(mode="json")
    thinking, text = body["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Two plus two."
    assert decode_reasoning_blob(thinking["signature"]) == "Two plus two."
    assert text == {"type": "text", "text": "It is 4.", "citations": None}


def stored() -> StoredResponse:
    request = ResponsesRequest(model="m", input="2+2?", include=["reasoning.encrypted_content"])
    return StoredResponse(id="resp_1", created_at=1, background=False, request=request)


JOB: list[Event] = [StartedEvent(prompt_tokens=5, reasoning=True), *THOUGHT, *ANSWER, DONE]


def test_responses_stream_a_reasoning_item_first_and_the_message_after_it() -> None:
    record = stored()
    stream = ResponseStream(record)
    out = stream.opening()
    for event in JOB:
        out.extend(stream.feed(event))
    shown = [e.model_dump(mode="json") for e in out]
    assert [e["sequence_number"] for e in shown] == list(range(len(shown)))
    placed = [(e["type"], e.get("output_index")) for e in shown]
    assert placed[2:9] == [
        ("response.output_item.added", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.output_item.done", 0),
    ]
    assert shown[2]["item"]["type"] == "reasoning"
    assert shown[8]["item"]["content"] == [{"type": "reasoning_text", "text": "Two plus two."}]
    assert ("response.output_text.delta", 1) in placed
    final = shown[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2


def test_a_responses_reasoning_item_carries_its_text_back_in_encrypted_content() -> None:
    body = render(stored(), Progress.of(JOB), "completed").model_dump(mode="json")
    item = body["output"][0]
    assert decode_reasoning_blob(item["encrypted_content"]) == "Two plus two."
    assert body["output"][1]["content"][0]["text"] == "It is 4."


def test_encrypted_content_is_left_out_unless_the_request_includes_it() -> None:
    record = stored()
    record.request.include = None
    body = render(record, Progress.of(JOB), "completed").model_dump(mode="json")
    assert body["output"][0]["encrypted_content"] is None
