"""Toolset ``image_gen``: ``image_generate`` (the Hermes agent's reference tool, docs/toolsets.md; earlier revision: prompt and aspect ratio).

Backends, chosen by ``settings.image_backend`` (``auto``: FAL when ``FAL_KEY`` is
set, else an OpenAI-compatible images endpoint when ``image_base_url`` is set):

- FAL (the reference's provider), synchronous run API over httpx:
  ``POST {fal_api_url}/{fal_model}`` with ``Authorization: Key <FAL_KEY>`` and
  ``{"prompt", "image_size"}`` -> ``{"images": [{"url", "width", "height", "content_type"}], ...}``
  (https://docs.fal.ai/model-apis/model-endpoints/synchronous-requests). ``image_size`` is FAL's
  preset: landscape_16_9, square_hd, portrait_16_9.
- OpenAI-compatible ``POST {image_base_url}/images/generations`` ``{"model", "prompt", "size", "n": 1}``
  -> ``{"data": [{"url"} | {"b64_json"}]}``; sizes 1536x1024, 1024x1024, 1024x1536. Base64 images are
  saved in the prompt's working directory (``generated_images/``) and their path is returned.

Result ``{"success": true, "image": <url or path>, "modality": "text"}`` (text-to-image);
failure ``{"success": false, "image": null, "error", "error_type"}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
from typing import Literal

from hermes_core.endpoints import is_local_endpoint
from hermes_core.settings import HermesSettings
from hermes_core.tools._http import HttpError, request
from hermes_core.tools._registry import ToolContext, tool

FAL_SIZES = {"landscape": "landscape_16_9", "square": "square_hd", "portrait": "portrait_16_9"}
OPENAI_SIZES = {"landscape": "1536x1024", "square": "1024x1024", "portrait": "1024x1536"}
IMAGE_DIR = "generated_images"
_MAX_RESPONSE_BYTES = 50_000_000


def configured_backend(settings: HermesSettings) -> str | None:
    """``fal``, ``openai`` or None: the image backend in use (a named one only when configured)."""
    usable = {
        "fal": bool(settings.fal_key),
        "openai": bool(settings.image_base_url)
        and (bool(settings.image_api_key or settings.api_key) or is_local_endpoint(settings.image_base_url)),
    }
    if settings.image_backend != "auto":
        return settings.image_backend if usable[settings.image_backend] else None
    return next((name for name, ok in usable.items() if ok), None)


def unavailable_reason(settings: HermesSettings) -> str | None:
    """Availability check: None when FAL_KEY, or an images endpoint with a key, is configured."""
    if configured_backend(settings):
        return None
    return "no image backend configured: set FAL_KEY, or HERMES_IMAGE_BASE_URL (and a key)"


def _error_type(exc: HttpError) -> str:
    if exc.kind != "http" or exc.status is None:
        return {
            "timeout": "timeout",
            "connection": "connection_error",
            "too_large": "response_too_large",
        }.get(exc.kind, "invalid_response")
    if exc.status in (401, 403):
        return "auth_error"
    if exc.status == 429:
        return "rate_limited"
    return "server_error" if exc.status >= 500 else "invalid_request"


def _fail(message: str, error_type: str) -> dict:
    return {"success": False, "image": None, "error": message, "error_type": error_type}


def _fal(ctx: ToolContext, prompt: str, aspect_ratio: str) -> str:
    settings = ctx.settings
    data = request(
        "POST",
        f"{settings.fal_api_url.rstrip('/')}/{settings.fal_model.strip('/')}",
        timeout=ctx.bound_timeout(settings.image_timeout),
        max_bytes=_MAX_RESPONSE_BYTES,
        retries=settings.web_max_retries,
        headers={"Authorization": f"Key {settings.fal_key.get_secret_value()}"},
        json={"prompt": prompt, "image_size": FAL_SIZES[aspect_ratio]},
    ).json()
    images = data.get("images") if isinstance(data, dict) else None
    if not images or not isinstance(images[0], dict) or not images[0].get("url"):
        raise HttpError(f"FAL answered without an image: {str(data)[:200]}")
    return images[0]["url"]


def _openai(ctx: ToolContext, prompt: str, aspect_ratio: str) -> str:
    settings = ctx.settings
    key = settings.image_api_key or settings.api_key
    data = request(
        "POST",
        f"{settings.image_base_url.rstrip('/')}/images/generations",
        timeout=ctx.bound_timeout(settings.image_timeout),
        max_bytes=_MAX_RESPONSE_BYTES,
        retries=settings.web_max_retries,
        headers={"Authorization": f"Bearer {key.get_secret_value()}"} if key else {},
        json={"model": settings.image_model, "prompt": prompt, "size": OPENAI_SIZES[aspect_ratio], "n": 1},
    ).json()
    items = data.get("data") if isinstance(data, dict) else None
    first = items[0] if items and isinstance(items[0], dict) else {}
    if first.get("url"):
        return first["url"]
    if first.get("b64_json"):
        try:
            raw = base64.b64decode(first["b64_json"], validate=True)
        except (binascii.Error, ValueError):
            raise HttpError("the images endpoint returned invalid base64") from None
        name = f"{IMAGE_DIR}/image_{hashlib.sha256(raw).hexdigest()[:12]}.png"
        ctx.env.write_file(name, raw)
        return posixpath.join(ctx.env.cwd, name)
    raise HttpError(f"the images endpoint answered without an image: {str(data)[:200]}")


@tool("image_gen", check=unavailable_reason)
def image_generate(
    ctx: ToolContext, prompt: str, aspect_ratio: Literal["landscape", "square", "portrait"] = "landscape"
) -> dict:
    """Generate an image from a text description and return its URL.

    Args:
        prompt: description of the wanted image.
        aspect_ratio: landscape (16:9 wide), square (1:1) or portrait (16:9 tall).
    """
    if not prompt.strip():
        return {"error": "prompt is required for image generation"}
    backend = configured_backend(ctx.settings)
    if backend is None:
        return _fail(unavailable_reason(ctx.settings) or "no image backend", "not_configured")
    try:
        image = (_fal if backend == "fal" else _openai)(ctx, prompt, aspect_ratio)
    except HttpError as exc:
        return _fail(f"Image generation failed ({backend}): {exc}", _error_type(exc))
    return {"success": True, "image": image, "modality": "text"}


__all__ = [
    "FAL_SIZES",
    "IMAGE_DIR",
    "OPENAI_SIZES",
    "configured_backend",
    "image_generate",
    "unavailable_reason",
]
