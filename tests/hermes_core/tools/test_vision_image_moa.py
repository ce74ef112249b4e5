"""vision_analyze and mixture_of_agents against the mock model over HTTP; image_generate against
local servers speaking FAL's and the OpenAI images API's formats."""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest
from werkzeug import Response

from hermes_core.mockllm import MockServer
from hermes_core.settings import HermesSettings
from hermes_core.tools import REGISTRY, ModelEndpoint, ToolContext, offered_tools
from hermes_core.tools.moa import APOLOGY
from tests.conftest import conversation_key
from tests.fixtures.servers import PAGES

RED = (PAGES / "red.png").read_bytes()
RED_SEEN = f"image/png, {len(RED)} bytes, sha256 {hashlib.sha256(RED).hexdigest()[:16]}"
NO_IMAGE_BACKEND = {"fal_key": None, "image_base_url": None, "image_api_key": None}


def run(env, name: str, args: dict, *, endpoint: ModelEndpoint | None = None, **settings) -> dict:
    ctx = ToolContext(env=env, settings=HermesSettings(**settings), model_endpoint=endpoint)
    return json.loads(REGISTRY[name].invoke(ctx, args))


def mock_endpoint(server, model: str = "mock/scripted") -> ModelEndpoint:
    return ModelEndpoint(base_url=server.base_url, api_key=None, model=model)


# ----------------------------------------------------------------------------- vision


def test_vision_is_offered_by_default_and_refused_with_a_keyless_own_endpoint():
    tools, missing = offered_tools(["vision", "moa"], HermesSettings(api_key=None))
    assert [t.name for t in tools] == ["vision_analyze", "mixture_of_agents"] and missing == {}
    _, missing = offered_tools(
        ["vision"], HermesSettings(api_key=None, vision_base_url="https://vision.example/v1")
    )
    assert missing == {"vision_analyze": "https://vision.example/v1 is set but has no API key"}


def test_vision_downloads_an_http_image_and_sends_it_inline(mock_server, site, env):
    question = "What colour is the rectangle?"
    result = run(
        env,
        "vision_analyze",
        {"image_url": f"{site}/red.png", "question": question},
        endpoint=mock_endpoint(mock_server),
        web_block_private_addresses=False,
    )
    words = "First describe the image fully its"  # the mock echoes six words of the prompt
    assert result == {"success": True, "analysis": f'Answer to "{words}": I see 1 image(s): {RED_SEEN}.'}


def test_vision_reads_a_path_of_the_environment_and_data_urls(mock_server, env):
    env.write_file("pics/red.png", RED)
    by_path = run(
        env,
        "vision_analyze",
        {"image_url": "pics/red.png", "question": "q"},
        endpoint=mock_endpoint(mock_server),
    )
    data_url = "data:image/png;base64," + base64.b64encode(RED).decode()
    by_data = run(
        env, "vision_analyze", {"image_url": data_url, "question": "q"}, endpoint=mock_endpoint(mock_server)
    )
    assert by_path["success"] and by_data["success"]
    assert by_path["analysis"].endswith(f"{RED_SEEN}.") and by_data["analysis"] == by_path["analysis"]


@pytest.mark.parametrize(
    ("image_url", "error"),
    [
        ("missing.png", "cannot read missing.png: FileNotFoundError"),
        ("{site}/index.html", "{site}/index.html: not a PNG, JPEG, GIF or WebP image"),
        ("{site}/nothing.png", "could not download {site}/nothing.png: HTTP 404"),
        ("ftp://host/x.png", "unsupported URL scheme in 'ftp://host/x.png'"),
        ("data:image/png,abc", "data: URL is not base64-encoded"),
    ],
)
def test_vision_image_errors_are_failed_results(mock_server, site, env, image_url, error):
    result = run(
        env,
        "vision_analyze",
        {"image_url": image_url.format(site=site), "question": "q"},
        endpoint=mock_endpoint(mock_server),
        web_block_private_addresses=False,
    )
    assert result["success"] is False
    assert result["error"].startswith(error.format(site=site))
    assert result["analysis"] == f"The image could not be analysed: {result['error']}"


def test_vision_bounds_and_private_address_guard(mock_server, site, env):
    too_big = run(
        env,
        "vision_analyze",
        {"image_url": f"{site}/red.png", "question": "q"},
        endpoint=mock_endpoint(mock_server),
        web_block_private_addresses=False,
        vision_max_image_bytes=10_000,
    )
    assert too_big["success"]  # 78 bytes fit
    blocked = run(
        env,
        "vision_analyze",
        {"image_url": f"{site}/red.png", "question": "q"},
        endpoint=mock_endpoint(mock_server),
    )
    assert blocked["error"].endswith("Blocked: 127.0.0.1 resolves to the private/internal address 127.0.0.1")


def test_vision_model_errors_and_own_settings(mock_server, env):
    env.write_file("red.png", RED)
    failing = run(
        env,
        "vision_analyze",
        {"image_url": "red.png", "question": "q"},
        endpoint=mock_endpoint(mock_server, "mock/scripted?fail_rate=1"),
        max_retries=0,
    )
    assert failing["success"] is False
    assert failing["error"].startswith("mock/scripted?fail_rate=1: HTTP 500: ")
    own = run(
        env,
        "vision_analyze",
        {"image_url": "red.png", "question": "q"},
        endpoint=None,
        vision_base_url=mock_server.base_url,
        vision_model="mock/vision",
    )
    assert own["success"] and own["analysis"].endswith(f"{RED_SEEN}.")
    nowhere = run(env, "vision_analyze", {"image_url": "red.png", "question": "q"}, endpoint=None)
    assert nowhere["error"].startswith("no model endpoint")


# ----------------------------------------------------------------------------- mixture of agents


def test_moa_defaults_to_the_run_model(mock_server, env):
    result = run(
        env,
        "mixture_of_agents",
        {"user_prompt": "Prove that 17 is prime"},
        endpoint=mock_endpoint(mock_server),
    )
    assert result == {
        "success": True,
        "response": 'Answer to "Prove that 17 is prime": this is the mock model\'s deterministic reply.',
        "models_used": {"reference_models": ["mock/scripted"], "aggregator_model": "mock/scripted"},
    }


def test_moa_references_in_parallel_one_success_is_enough(env, tmp_path):
    log = tmp_path / "requests.jsonl"
    prompt = "Which is larger, 2^10 or 10^3?"
    with MockServer(request_log=str(log)) as server:
        started = time.monotonic()
        result = run(
            env,
            "mixture_of_agents",
            {"user_prompt": prompt},
            endpoint=mock_endpoint(server, "mock/main"),
            max_retries=0,
            moa_reference_models=["mock/a?latency_ms=2000", "mock/b?latency_ms=2000", "mock/c?fail_rate=1"],
            moa_aggregator_model="mock/agg",
        )
        elapsed = time.monotonic() - started
    assert result["success"] is True
    assert result["models_used"] == {
        "reference_models": ["mock/a?latency_ms=2000", "mock/b?latency_ms=2000", "mock/c?fail_rate=1"],
        "aggregator_model": "mock/agg",
    }
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["model"], r["status"]) for r in lines[-1:]] == [("mock/agg", 200)]
    assert sorted((r["model"], r["status"]) for r in lines[:-1]) == [
        ("mock/a?latency_ms=2000", 200),
        ("mock/b?latency_ms=2000", 200),
        ("mock/c?fail_rate=1", 500),
    ]
    assert {r["conversation"] for r in lines} == {conversation_key(prompt)}
    # a and b (2 s each) answered together, not one after the other (4 s); room for a loaded CI machine
    assert 2.0 <= elapsed < 3.5


def test_moa_fails_with_the_apology_when_every_reference_fails(mock_server, env):
    result = run(
        env,
        "mixture_of_agents",
        {"user_prompt": "hard"},
        endpoint=mock_endpoint(mock_server),
        max_retries=0,
        moa_reference_models=["mock/x?fail_rate=1"],
    )
    assert result["success"] is False and result["response"] == APOLOGY
    assert result["error"].startswith("every reference model failed: mock/x?fail_rate=1: HTTP 500")


# ----------------------------------------------------------------------------- image generation


def fal(api) -> dict:
    return {**NO_IMAGE_BACKEND, "fal_key": "fal-test", "fal_api_url": api.url_for("/").rstrip("/")}


def test_image_gen_availability():
    _, missing = offered_tools(["image_gen"], HermesSettings(**NO_IMAGE_BACKEND))
    assert missing == {
        "image_generate": "no image backend configured: set FAL_KEY, or HERMES_IMAGE_BASE_URL (and a key)"
    }
    tools, _ = offered_tools(["image_gen"], HermesSettings(**{**NO_IMAGE_BACKEND, "fal_key": "k"}))
    assert [t.name for t in tools] == ["image_generate"]


def test_fal_request_and_result(api, env):
    api.expect_request(
        "/fal-ai/flux-2/klein/9b",
        method="POST",
        headers={"Authorization": "Key fal-test"},
        json={"prompt": "a red fox in the snow", "image_size": "square_hd"},
    ).respond_with_json(
        {
            "images": [{"url": "https://v3.fal.media/files/fox.png", "width": 1024, "height": 1024, "content_type": "image/png"}],
            "seed": 42,
            "has_nsfw_concepts": [False],
            "prompt": "a red fox in the snow",
        }
    )  # fmt: skip
    result = run(
        env, "image_generate", {"prompt": "a red fox in the snow", "aspect_ratio": "square"}, **fal(api)
    )
    assert result == {"success": True, "image": "https://v3.fal.media/files/fox.png", "modality": "text"}


@pytest.mark.parametrize(
    ("status", "body", "error_type", "message"),
    [
        (401, {"detail": "Invalid API key"}, "auth_error", "HTTP 401: Invalid API key"),
        (422, {"detail": [{"loc": ["body", "prompt"], "msg": "field required", "type": "missing"}]}, "invalid_request", "HTTP 422: field required"),
        (500, {"detail": "Internal error"}, "server_error", "HTTP 500: Internal error"),
    ],
)  # fmt: skip
def test_fal_errors(api, env, status, body, error_type, message):
    api.expect_request("/fal-ai/flux-2/klein/9b").respond_with_json(body, status=status)
    result = run(env, "image_generate", {"prompt": "x"}, web_max_retries=0, **fal(api))
    assert result == {
        "success": False,
        "image": None,
        "error": f"Image generation failed (fal): {message}",
        "error_type": error_type,
    }


def test_fal_rate_limit_retry_and_timeout(api, env):
    api.expect_ordered_request("/fal-ai/flux-2/klein/9b").respond_with_json(
        {"detail": "Too many requests"}, status=429, headers={"Retry-After": "1"}
    )
    api.expect_ordered_request("/fal-ai/flux-2/klein/9b").respond_with_json(
        {"images": [{"url": "https://f/1.png"}]}
    )
    ok = run(env, "image_generate", {"prompt": "x"}, **fal(api))
    assert ok["image"] == "https://f/1.png" and len(api.log) == 2
    api.clear()

    def slow(request):
        time.sleep(1.5)
        return Response("{}", content_type="application/json")

    api.expect_request("/fal-ai/flux-2/klein/9b").respond_with_handler(slow)
    late = run(env, "image_generate", {"prompt": "x"}, image_timeout=0.4, web_max_retries=0, **fal(api))
    assert late["error_type"] == "timeout" and late["error"].endswith("timed out after 0.4 s")


def test_openai_images_endpoint_saves_base64_into_the_working_directory(api, env):
    api.expect_request(
        "/v1/images/generations",
        method="POST",
        headers={"Authorization": "Bearer sk-img"},
        json={"model": "gpt-image-1", "prompt": "a red square", "size": "1536x1024", "n": 1},
    ).respond_with_json({"created": 1, "data": [{"b64_json": base64.b64encode(RED).decode()}]})
    settings = {
        **NO_IMAGE_BACKEND,
        "image_base_url": api.url_for("/v1"),
        "image_api_key": "sk-img",
    }
    result = run(env, "image_generate", {"prompt": "a red square"}, **settings)
    assert result["success"] is True and result["modality"] == "text"
    name = f"generated_images/image_{hashlib.sha256(RED).hexdigest()[:12]}.png"
    assert result["image"] == f"{env.cwd}/{name}"
    assert env.read_file(name) == RED
