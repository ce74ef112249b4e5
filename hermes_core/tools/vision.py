"""Toolset ``vision``: ``vision_analyze`` (the Hermes agent's reference tool, docs/toolsets.md; earlier revision without ``region``).

The image is loaded here and sent inline as a ``data:`` URL to an
OpenAI-compatible vision model (Chat Completions ``image_url`` content part):
an http(s) URL is downloaded (size-bounded, and refused for private addresses
when ``web_block_private_addresses`` is on), a path is read from the prompt's
environment, a ``data:`` URL is checked and passed on. PNG, JPEG, GIF and WebP
are accepted. The endpoint and model follow :mod:`hermes_core.tools._aux_model`:
``vision_base_url``/``vision_model`` when set, else the run's own.
"""

from __future__ import annotations

import base64
import binascii
import re

from hermes_core.exceptions import ConfigError
from hermes_core.settings import HermesSettings
from hermes_core.tools import _aux_model
from hermes_core.tools._http import HttpError, request
from hermes_core.tools._registry import ToolContext, tool

PROMPT = (
    "First describe the image fully: its subject, layout, any text in it and notable details. "
    "Then answer this question about it:\n\n{question}"
)
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL)


class ImageError(Exception):
    """The image could not be loaded (missing, too large, not an image, blocked)."""


def unavailable_reason(settings: HermesSettings) -> str | None:
    """None unless ``vision_base_url`` is set without any key (the default is the run's own endpoint)."""
    return _aux_model.own_endpoint_problem(
        settings.vision_base_url, settings.vision_api_key, settings.api_key
    )


def sniff_mime(data: bytes) -> str | None:
    """The image type of ``data`` from its magic bytes: image/png, image/jpeg, image/gif, image/webp, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def to_data_url(data: bytes, max_bytes: int, origin: str) -> str:
    """``data:<mime>;base64,...`` of image bytes.

    Raises:
        ImageError: more than ``max_bytes``, or not a PNG/JPEG/GIF/WebP image.
    """
    if len(data) > max_bytes:
        raise ImageError(f"{origin}: image too large ({len(data)} bytes, limit {max_bytes})")
    mime = sniff_mime(data)
    if mime is None:
        raise ImageError(f"{origin}: not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def load_image(ctx: ToolContext, image_url: str) -> str:
    """A ``data:`` URL of the image at ``image_url`` (http(s) URL, data: URL or path in the environment).

    Raises:
        ImageError: the image cannot be loaded, is too large or is not an image.
    """
    settings = ctx.settings
    source = image_url.strip()
    limit = settings.vision_max_image_bytes
    if source.startswith("data:"):
        match = _DATA_URL.match(source)
        if not match or not match.group("b64"):
            raise ImageError("data: URL is not base64-encoded")
        try:
            data = base64.b64decode(match.group("data"), validate=False)
        except (binascii.Error, ValueError):
            raise ImageError("data: URL has invalid base64") from None
        return to_data_url(data, limit, "data: URL")
    if source.startswith(("http://", "https://")):
        try:
            result = request(
                "GET",
                source,
                timeout=ctx.bound_timeout(settings.web_timeout),
                max_bytes=limit,
                retries=settings.web_max_retries,
                check_address=settings.web_block_private_addresses,
                headers={"Accept": "image/*"},
            )
        except HttpError as exc:
            raise ImageError(f"could not download {source}: {exc}") from None
        return to_data_url(result.content, limit, source)
    if "://" in source:
        raise ImageError(f"unsupported URL scheme in {source!r} (http, https, data: or a file path)")
    try:
        data = ctx.env.read_file(source)
    except (FileNotFoundError, IsADirectoryError, PermissionError, OSError) as exc:
        raise ImageError(f"cannot read {source}: {type(exc).__name__}: {exc}") from None
    return to_data_url(data, limit, source)


def ask_vision_model(ctx: ToolContext, data_url: str, question: str) -> str:
    """The vision model's answer about the image (``data_url``) to ``question``.

    Raises:
        _aux_model.AuxModelError: no endpoint, provider error after retries, empty answer.
    """
    settings = ctx.settings
    endpoint = _aux_model.resolve(
        ctx, model=settings.vision_model, base_url=settings.vision_base_url, api_key=settings.vision_api_key
    )
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": PROMPT.format(question=question)},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        }
    ]
    return _aux_model.complete(ctx, endpoint, messages, settings.vision_timeout)


@tool("vision", check=unavailable_reason)
def vision_analyze(ctx: ToolContext, image_url: str, question: str) -> dict:
    """Analyse an image and answer a question about it.

    Args:
        image_url: http(s) URL, local file path or data: URL of the image.
        question: what to answer about the image.
    """
    try:
        analysis = ask_vision_model(ctx, load_image(ctx, image_url), question)
    except (ImageError, _aux_model.AuxModelError, ConfigError) as exc:
        return {
            "success": False,
            "error": str(exc),
            "analysis": f"The image could not be analysed: {exc}",
        }
    return {"success": True, "analysis": analysis}


__all__ = [
    "PROMPT",
    "ImageError",
    "ask_vision_model",
    "load_image",
    "sniff_mime",
    "to_data_url",
    "unavailable_reason",
    "vision_analyze",
]
