"""The Responses API's items: input messages and their text parts, function calls (output items,
and input items when passed back), their outputs, and function tools.

A client that goes on with a conversation passes the earlier output back as input (the OpenAI
SDK's `input += response.output`, the Agents SDK's `to_input_list()`, Codex with `store: false`),
so every field mlxq's own output items carry is accepted back where the SDK's input types allow
it: a message's `id` and `status`, an `output_text` part's `annotations` and `logprobs`, a
function call's `id` and `status`. None of them changes the prompt: they describe an earlier
answer, not what to generate. Any other field is a 400 naming it.

A reasoning item passed back gives its text to the assistant turn that follows it (the chat
template decides whether to render it: Qwen3's keeps only the current turn's): its
`reasoning_text` content, else what its `encrypted_content` carries when mlxq made it
(shared/wire/responses/reasoning_blob.py), else its summary. An opaque value mlxq did not make is
accepted and left out.

A user message may carry images: `input_image` parts, a data URL or a link in `image_url`,
with their `detail`; one named by `file_id` is refused (400 naming it): the Files API keeps batch
inputs here, not images to look up. They become the chat message's image parts, in place.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from shared.wire.chat.chat_messages import ImagePart, ImageUrl, TextPart
from shared.wire.chat.completions import MAX_CONTENT_CHARS, MAX_CONTENT_PARTS, ChatMessage
from shared.wire.errors import InvalidRequestError, UnsupportedParameterError
from shared.wire.generation.tools import (
    ChatTool,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    ToolCall,
)
from shared.wire.images import Detail, ImageInput
from shared.wire.responses.reasoning_blob import decode_reasoning_blob

Text = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputText(BaseModel):
    """A text part of an input message (`output_text` when an assistant turn is passed back,
    with the annotations and log probabilities it was output with)."""

    model_config = ConfigDict(extra="forbid")
    type: Annotated[str, Field(max_length=64)]
    text: Text = ""
    annotations: Annotated[list[Any], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    logprobs: Annotated[list[Any], Field(max_length=MAX_CONTENT_CHARS)] | None = None

    @model_validator(mode="after")
    def _text_only(self) -> InputText:
        if self.type not in ("input_text", "output_text"):
            raise UnsupportedParameterError(
                f"'{self.type}' content is not supported: only text and images are",
                param="input",
            )
        return self


class InputImage(BaseModel):
    """An image part of a user message: a data URL or a link in `image_url`. `file_id` is
    declared so that it is refused by name (400), not as an unknown field (`check`, which the
    request's validation runs where it knows the part's place)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["input_image"]
    image_url: Annotated[str, Field(min_length=1)] | None = None
    file_id: Annotated[str, Field(max_length=128)] | None = None
    detail: Detail | None = None

    def check(self, param: str) -> None:
        """Refuse, naming it under `param`, an image this server cannot take."""
        if self.file_id is not None:
            raise UnsupportedParameterError(
                f"'{param}.file_id' is not supported: an image is not looked up among files "
                "here; send it in image_url as a data URL (data:image/png;base64,...).",
                param=f"{param}.file_id",
            )
        if self.image_url is None:
            raise InvalidRequestError(
                f"'{param}' needs its image_url.", param=f"{param}.image_url", code="missing"
            )

    def chat_part(self) -> ImagePart:
        url = ImageUrl(url=str(self.image_url), detail=self.detail)
        return ImagePart(type="image_url", image_url=url)


def _part_type(value: Any) -> str:
    """A content part's kind: an image, or text (whose model refuses any other type). The tags
    read as pydantic's own union names (a '-' in them), so an error's `param` leaves them out:
    `input.0.content.1.detail`, as the request spells it."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "image-part" if kind == "input_image" else "text-part"


InputPart = Annotated[
    Annotated[InputText, Tag("text-part")] | Annotated[InputImage, Tag("image-part")],
    Discriminator(_part_type),
]


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[InputPart], Field(max_length=MAX_CONTENT_PARTS)]
    # An output item passed back as input keeps its id, status and phase; none changes the prompt.
    id: Annotated[str, Field(max_length=128)] | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="after")
    def _images_from_users(self) -> InputMessage:
        if self.role != "user" and self.image_parts():
            raise PydanticCustomError("user_only", "only user messages carry images")
        return self

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, InputText))

    def image_parts(self) -> list[tuple[int, InputImage]]:
        parts = self.content if isinstance(self.content, list) else []
        return [(i, part) for i, part in enumerate(parts) if isinstance(part, InputImage)]

    def images(self, param: str) -> list[ImageInput]:
        """Its images as given, named under `param` (the item's own name)."""
        for i, part in self.image_parts():
            part.check(f"{param}.content.{i}")
        return [
            ImageInput.of_url(f"{param}.content.{i}.image_url", str(part.image_url))
            for i, part in self.image_parts()
        ]

    def chat_message(self) -> ChatMessage:
        """The message for the chat template: its text, or its parts in order with images."""
        if isinstance(self.content, str) or not self.image_parts():
            return ChatMessage(role=self.role, content=self.text())
        parts: list[TextPart | ImagePart] = [
            part.chat_part()
            if isinstance(part, InputImage)
            else TextPart(type="text", text=part.text)
            for part in self.content
        ]
        return ChatMessage(role=self.role, content=parts)


class Caller(BaseModel):
    """Who made a call (the model itself, `direct`, or a program it ran): it describes an
    earlier turn and changes nothing here."""

    model_config = ConfigDict(extra="forbid")
    type: Annotated[str, Field(max_length=64)]
    caller_id: Annotated[str, Field(max_length=128)] | None = None


def _unset(value: Any) -> bool:
    return value is None


class FunctionCallItem(BaseModel):
    """A call the model made: an output item, and an input item when passed back (with the
    fields OpenAI's own calls carry, which mlxq's never set and leaves out of its output)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["function_call"] = "function_call"
    id: Annotated[str, Field(max_length=128)] | None = None
    call_id: Annotated[str, Field(max_length=128)]
    name: FunctionName
    arguments: Text
    status: ItemStatus | None = None
    caller: Caller | None = Field(default=None, exclude_if=_unset)
    namespace: Annotated[str, Field(max_length=256)] | None = Field(default=None, exclude_if=_unset)
    # `async` in JSON; the SDK's `model_dump()` writes the Python name.
    async_: bool | None = Field(default=None, alias="async", exclude_if=_unset)


class SummaryText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["summary_text"] = "summary_text"
    text: Text


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["reasoning_text"] = "reasoning_text"
    text: Text


class ReasoningItem(BaseModel):
    """A model's reasoning: an output item, and an input item when passed back."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["reasoning"] = "reasoning"
    id: Annotated[str, Field(max_length=128)] | None = None
    summary: Annotated[list[SummaryText], Field(max_length=MAX_CONTENT_PARTS)] = []
    content: Annotated[list[ReasoningText], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    encrypted_content: Text | None = None
    status: ItemStatus | None = None

    def reasoning(self) -> str | None:
        """The reasoning it carries for the chat template; None: none this server can read."""
        if self.content:
            return "".join(part.text for part in self.content)
        carried = decode_reasoning_blob(self.encrypted_content) if self.encrypted_content else None
        if carried is not None:
            return carried
        return "\n".join(part.text for part in self.summary) or None


class FunctionCallOutput(BaseModel):
    """The result of a call, as input."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call_output"]
    id: Annotated[str, Field(max_length=128)] | None = None
    call_id: Annotated[str, Field(max_length=128)]
    output: Text
    status: ItemStatus | None = None
    caller: Caller | None = None
    name: Annotated[str, Field(max_length=256)] | None = None


def _item_type(value: Any) -> str | None:
    """An input item's kind; items without a type are messages. None: not an item at all."""
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    """A function tool as the Responses API declares it (chat's, flattened)."""

    model_config = ConfigDict(extra="forbid")
    type: Annotated[str, Field(max_length=64)]
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise UnsupportedParameterError(
                f"'{kind}' tools are not supported: only function tools are", param="tools"
            )
        return value

    def as_chat_tool(self) -> ChatTool:
        function = FunctionDefinition(
            name=self.name, description=self.description, parameters=self.parameters
        )
        return ChatTool(type="function", function=function)


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: FunctionName


def add_reasoning(messages: list[ChatMessage], texts: list[str]) -> None:
    """Reasoning items join the assistant turn right after them (a response's output: its
    reasoning, then its message or calls), once that turn is the last message; reasoning with
    no turn after it (the next item is the user's) described no answer and is left out."""
    last = messages[-1] if messages else None
    if not texts or last is None or last.role != "assistant":
        return
    earlier = last.reasoning_text()
    last.reasoning_content = "\n".join([earlier, *texts] if earlier else texts)


def add_call(messages: list[ChatMessage], item: FunctionCallItem) -> None:
    """An earlier call joins the assistant turn it was part of: the calls right after an
    assistant message (a response's output: its message item, then its calls) are that turn's."""
    call = ToolCall(
        id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
    )
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", tool_calls=[call]))
