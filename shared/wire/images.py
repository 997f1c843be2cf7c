"""Images in requests: the one rule for what an image may be, and its content id.

Each API names its image parts in its own shape (chat's `image_url`, the Responses API's
`input_image`, Anthropic's `image` block); each request lists them as `ImageInput`s, an image as
it was given and the parameter naming it (`messages.0.content.1.image_url.url`). `check_images`
then checks them all, in order, before anything is queued, cheapest first:

1. how many: at most `ImageLimits.max_images` per request, counted before any is decoded;
2. where it is: a `data:` URL (base64) is read here; an http(s) URL is refused, since fetching is
   off unless the operator allows it (MLXQ_IMAGE_URLS), and not built yet even then;
3. its bytes: the base64 text's length bounds them before it is decoded, then the bytes
   themselves (at most `max_bytes`);
4. its header: Pillow reads the format and the declared width and height without decoding
   (`Image.open`, lazy); a format other than PNG, JPEG, WebP or GIF, or more than `max_pixels`
   declared, is refused here: a decompression bomb is refused before it is decoded;
5. its pixels: only then is it decoded (its first frame), and data that does not decode is
   refused. Its content id is the sha256 of its pixels as RGB with their size, so the same
   picture has the same id however it was encoded, and another picture another id: the key an
   engine's prefix cache needs at the image's positions.

Every refusal is a 400 naming the part. Pure: bytes in memory, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from shared.wire.errors import InvalidRequestError

# The image formats taken, by Pillow's name, and their media types (those OpenAI and Anthropic
# take: PNG, JPEG, WebP and non-animated GIF; an animated one gives its first frame here).
FORMATS: dict[str, str] = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
}
# A JPEG with a multi-picture segment (a phone's photo) opens as Pillow's MPO: a JPEG still.
_OPENED_AS = {**FORMATS, "MPO": "image/jpeg"}
MediaType = Literal["image/png", "image/jpeg", "image/webp", "image/gif"]
Detail = Literal["auto", "low", "high"]
# How an image URL that is not a data URL is answered (MLXQ_IMAGE_URLS): refused as off, or
# allowed, which is refused too until fetching is built, saying so.
UrlPolicy = Literal["off", "allow"]


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may be (shared/queue/config.py has their settings)."""

    max_bytes: int  # decoded bytes of one image
    max_images: int  # images in one request, its whole conversation
    max_pixels: int  # width x height one image's header may declare
    urls: UrlPolicy = "off"


@dataclass(frozen=True)
class ImageInput:
    """One image as a request gave it: base64 `data` (with its declared media type), or a `url`
    that is not a data URL; `param` names the field that carries it."""

    param: str
    data: str | None = None
    media_type: str | None = None
    url: str | None = None

    @classmethod
    def of_url(cls, param: str, url: str) -> ImageInput:
        """An image given as a URL: a data URL's parts, or the URL itself."""
        if not url.startswith("data:"):
            return cls(param=param, url=url)
        head, comma, data = url.partition(",")
        fields = head.removeprefix("data:").split(";")
        if not comma or "base64" not in fields[1:]:
            raise InvalidRequestError(
                f"Invalid image at '{param}': a data URL must be base64 "
                "(data:image/png;base64,<data>).",
                param=param,
                code="invalid_image",
            )
        return cls(param=param, data=data, media_type=fields[0].strip().lower())


class ImageRef(BaseModel):
    """A checked image: what it is, and its content id (the sha256 of its RGB pixels and
    size), for the engine and the prefix cache."""

    model_config = ConfigDict(frozen=True)
    content_id: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    media_type: MediaType
    width: int
    height: int
    bytes: int


def check_images(images: list[ImageInput], limits: ImageLimits) -> list[ImageRef]:
    """Check a request's images (the module docstring's order) and return them checked, in
    order; the first refusal is raised, a 400 naming its part."""
    if len(images) > limits.max_images:
        raise InvalidRequestError(
            f"The request carries {len(images)} images; at most {limits.max_images} are taken "
            f"in one request (MLXQ_IMAGE_MAX_PER_REQUEST): '{images[limits.max_images].param}' "
            "is one too many.",
            param=images[limits.max_images].param,
            code="too_many_images",
        )
    return [check_image(image, limits) for image in images]


def check_image(image: ImageInput, limits: ImageLimits) -> ImageRef:
    """One image checked and identified, or a 400 naming its part."""
    if image.data is None:
        raise _url_refusal(image, limits.urls)
    if image.media_type not in FORMATS.values():
        raise _refusal(
            image,
            f"media type '{str(image.media_type)[:40]}' is not taken: send "
            + ", ".join(FORMATS.values()),
        )
    raw = _decoded(image, limits.max_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        picture = _opened(image, raw, limits.max_pixels)
        return ImageRef(
            content_id=_content_id(image, picture),
            media_type=_OPENED_AS[str(picture.format)],
            width=picture.width,
            height=picture.height,
            bytes=len(raw),
        )


def _refusal(image: ImageInput, why: str, code: str = "invalid_image") -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid image at '{image.param}': {why}.", param=image.param, code=code
    )


def _url_refusal(image: ImageInput, policy: UrlPolicy) -> InvalidRequestError:
    url = str(image.url)
    if not url.lower().startswith(("http://", "https://")):
        return _refusal(image, "an image URL must be a data URL (data:image/png;base64,...)")
    if policy == "off":
        why = (
            "image URLs are not fetched (MLXQ_IMAGE_URLS is off); send the image inline as a "
            "data URL (data:image/png;base64,...)"
        )
    else:
        why = (
            "fetching image URLs is not built yet, though MLXQ_IMAGE_URLS allows it; send the "
            "image inline as a data URL (data:image/png;base64,...)"
        )
    return _refusal(image, why, code="image_url_not_fetched")


def _decoded(image: ImageInput, max_bytes: int) -> bytes:
    """The image's bytes from its base64, bounded before it is decoded."""
    text = str(image.data)
    if len(text) // 4 * 3 > max_bytes + 2:  # base64 holds 3 bytes in 4 characters
        raise _too_large(image, max_bytes)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _refusal(image, "its data is not base64") from None
    if len(raw) > max_bytes:
        raise _too_large(image, max_bytes)
    if not raw:
        raise _refusal(image, "its data is empty")
    return raw


def _too_large(image: ImageInput, limit: int, unit: str = "bytes") -> InvalidRequestError:
    """The refusal of an image over its limit of bytes, or of the pixels its header declares."""
    setting = "MLXQ_IMAGE_MAX_BYTES" if unit == "bytes" else "MLXQ_IMAGE_MAX_PIXELS"
    said = "is larger than" if unit == "bytes" else "declares more than"
    return _refusal(image, f"it {said} {limit} {unit} ({setting})", code="image_too_large")


def _opened(image: ImageInput, raw: bytes, max_pixels: int) -> Image.Image:
    """The image's header read, not yet decoded: its format and declared size checked."""
    try:
        picture = Image.open(io.BytesIO(raw), formats=list(FORMATS))
    except Image.DecompressionBombError:  # past Pillow's own bound, which ours is below
        raise _too_large(image, max_pixels, "pixels") from None
    except (OSError, ValueError, SyntaxError, EOFError):
        raise _refusal(image, "its data is not a PNG, JPEG, WebP or GIF image") from None
    if picture.format not in _OPENED_AS:
        raise _refusal(image, f"{picture.format} images are not taken: only PNG, JPEG, WebP, GIF")
    if picture.width <= 0 or picture.height <= 0:
        raise _refusal(image, "it declares no pixels")
    if picture.width * picture.height > max_pixels:
        raise _too_large(image, max_pixels, "pixels")
    return picture


def _content_id(image: ImageInput, picture: Image.Image) -> str:
    """The sha256 of the image's first frame as RGB, with its size; decoding it here is what
    finds data that is not the image its header says."""
    try:
        pixels = picture.convert("RGB")
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        raise _refusal(image, "its data does not decode: it is corrupt or cut short") from None
    digest = hashlib.sha256(f"RGB {pixels.width}x{pixels.height}\n".encode())
    digest.update(pixels.tobytes())
    return digest.hexdigest()
