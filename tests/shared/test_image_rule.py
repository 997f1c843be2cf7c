"""The one rule for an image in a request (shared/wire/images.py), without the app: what passes,
what its content id is, and the order of the checks."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from shared.wire.errors import InvalidRequestError
from shared.wire.images import ImageInput, ImageLimits, check_images

LIMITS = ImageLimits(max_bytes=1 << 20, max_images=2, max_pixels=64 * 64)


def encoded(picture: Image.Image, form: str, **options: object) -> ImageInput:
    out = io.BytesIO()
    picture.save(out, form, **options)
    media_type = "image/" + form.lower()
    return ImageInput(
        param="p", data=base64.b64encode(out.getvalue()).decode(), media_type=media_type
    )


def test_an_image_s_content_id_is_its_pixels_not_its_encoding() -> None:
    green = Image.new("RGB", (16, 16), (10, 200, 30))
    as_png, as_webp, as_gif = check_images(
        [
            encoded(green, "PNG"),
            encoded(green, "WEBP", lossless=True),
            encoded(green.convert("P"), "GIF"),
        ],
        ImageLimits(max_bytes=1 << 20, max_images=3, max_pixels=64 * 64),
    )
    assert as_png.content_id == as_webp.content_id
    assert (as_webp.media_type, as_webp.width, as_webp.height) == ("image/webp", 16, 16)
    assert as_gif.media_type == "image/gif"
    (other,) = check_images([encoded(Image.new("RGB", (16, 16), (10, 200, 31)), "PNG")], LIMITS)
    assert other.content_id != as_png.content_id
    (wider,) = check_images([encoded(Image.new("RGB", (32, 8), (10, 200, 30)), "PNG")], LIMITS)
    assert wider.content_id != as_png.content_id  # the same bytes of pixels, another size


def test_a_jpeg_is_taken_and_its_declared_type_need_not_match_its_data() -> None:
    jpeg = encoded(Image.new("RGB", (8, 8), (1, 2, 3)), "JPEG")
    (checked,) = check_images(
        [ImageInput(param="p", data=jpeg.data, media_type="image/png")], LIMITS
    )
    assert checked.media_type == "image/jpeg"


def test_images_are_counted_before_any_is_decoded() -> None:
    broken = ImageInput(param="first", data="not base64!", media_type="image/png")
    third = ImageInput(param="third", data="not base64!", media_type="image/png")
    with pytest.raises(InvalidRequestError, match="at most 2") as refused:
        check_images([broken, broken, third], LIMITS)
    assert refused.value.param == "third"  # the first one too many, though the first is bad
    assert refused.value.code == "too_many_images"


def test_pixels_are_bounded_by_the_header_and_bytes_by_the_base64() -> None:
    with pytest.raises(InvalidRequestError, match="MLXQ_IMAGE_MAX_PIXELS"):
        check_images([encoded(Image.new("RGB", (65, 64)), "PNG")], LIMITS)
    tight = ImageLimits(max_bytes=8, max_images=1, max_pixels=64 * 64)
    with pytest.raises(InvalidRequestError, match="MLXQ_IMAGE_MAX_BYTES"):
        check_images([ImageInput(param="p", data="A" * 1_000_000, media_type="image/png")], tight)
