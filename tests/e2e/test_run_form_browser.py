"""The deployment's custom-run form in the real Prefect UI (Debian's Chromium driven by Playwright).

Prefect 3.9.1 ships two UIs, both tested: the classic one (``/deployments/deployment/<id>/run``,
which renders parameter descriptions as markdown/HTML) and the new one (``/v2/...``, where ``/``
leads). The stack (server, ``prefect deploy --all`` of prefect.yaml, worker) is
the session's ``stack`` fixture (:mod:`tests.prefect_stack`). Every request not to 127.0.0.1 is blocked. The form is
submitted untouched: the server's parameter schema check must accept what it sends (the flow run
is scheduled in 2100, so the worker leaves it alone, and deleted). Screenshots go to
``test-artifacts/run-form-*.png``.

The same stack also takes the fixed values as ``prefect deployment run --param on_budget=cancel``
types them, refuses one outside the list, and resumes a run that a Python caller began with None
(the run.json of older code) with ``default``: the defining settings still match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import jsonl_rows, model_requests
from tests.prefect_stack import REPO, api_call

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip
DROPDOWNS = ("on_budget", "task_runner", "terminal_env", "provider_sort", "reasoning_effort", "distribution")
"""Parameters with a fixed set of values: each must be a plain dropdown (no type picker)."""
UIS = {
    "v1": "/deployments/deployment/{id}/run",
    "v2": "/v2/deployments/deployment/{id}/run",
}


def _property(page, ui: str, name: str, required: bool):
    """The locator of one parameter's block in the form (label, description, input)."""
    label = name if required else f"{name} (Optional)"
    if ui == "v1":
        title = page.locator(".schema-form-property__label").get_by_text(label, exact=True)
        return page.locator(".schema-form-property").filter(has=title)
    return page.locator("label").get_by_text(label, exact=True).locator("xpath=ancestor::div[.//fieldset][1]")


def _dropdown(page, ui: str, block, name: str) -> tuple[str, list[str]]:
    """The value a dropdown shows and the values it offers (opened, read, closed again)."""
    if ui == "v1":
        control = block.locator(".p-select-button__control")
        shown = control.inner_text()
        control.focus()
        page.keyboard.press("ArrowDown")  # opens the classic UI's select
        options = page.get_by_role("listbox").get_by_role("option")
    else:
        control = block.get_by_role("button", name=f"Select {name}")
        shown = control.inner_text()
        control.click()
        options = page.get_by_role("option")
    options.first.wait_for()
    values = [text.strip() for text in options.all_inner_texts()]
    page.keyboard.press("Escape")
    options.first.wait_for(state="detached")
    return shown.strip(), values


def _submit(page, attempts: int = 3):
    """Click the form's Submit; returns the reply to its ``create_flow_run`` request.

    Prefect answers 503 ("Service Unavailable", a retryable error: SQLite's "database is locked"
    while the server's scheduler and the polling worker write, PrefectHQ/prefect#16102) now and
    then on a busy machine; the UI then shows an error and stays on the form, and the user
    submits again. Any other status is returned at once.
    """
    for _ in range(attempts):
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as reply:
            page.get_by_role("button", name="Submit").click()
        if reply.value.status != 503:
            break
    return reply.value


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_custom_run_form_shows_descriptions_whole_and_dropdowns(stack):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            raise RuntimeError("chromium missing: .ci/run must install Debian's chromium")
        pytest.skip("chromium not installed")
    from playwright.sync_api import expect, sync_playwright

    deployment = api_call("GET", f"{stack.api}/deployments/name/generate-trajectories/generate").json()
    schema = deployment["parameter_openapi_schema"]
    props, required = schema["properties"], set(schema["required"])
    assert "<" not in props["run_name"]["description"]
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    created: dict[str, dict] = {}

    def far_ahead(route):  # the form's own request, scheduled so that the worker does not run it
        body = json.loads(route.request.post_data)
        body["state"].setdefault("state_details", {})["scheduled_time"] = "2100-01-01T00:00:00+00:00"
        route.continue_(post_data=json.dumps(body))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 6400})  # the whole form in view
            context.route(re.compile(r"^(?!http://127\.0\.0\.1[:/]).*"), lambda route: route.abort())
            for ui, path in UIS.items():
                page = context.new_page()
                page.route("**/api/deployments/*/create_flow_run", far_ahead)
                page.goto(f"http://127.0.0.1:{stack.port}{path.format(id=deployment['id'])}")
                expect(_property(page, ui, "run_name", True)).to_be_visible(timeout=30_000)
                page.wait_for_load_state("networkidle")
                for name, prop in props.items():
                    block = _property(page, ui, name, name in required)
                    expect(block, f"{ui} {name}").to_have_count(1)
                    expect(block.get_by_text(prop["description"], exact=True), f"{ui} {name}").to_be_visible()
                run_name_text = _property(page, ui, "run_name", True).inner_text()
                assert "the run writes to output_dir/run_name/;" in run_name_text, run_name_text
                assert "Output folder //" not in page.inner_text("body")
                for name in DROPDOWNS:
                    block = _property(page, ui, name, False)
                    picker = ".p-button-group" if ui == "v1" else "[role=tablist]"
                    assert block.locator(picker).count() == 0, f"{ui} {name} has a type picker"
                    shown, values = _dropdown(page, ui, block, name)
                    assert (shown, values) == (props[name]["default"], props[name]["enum"]), (ui, name)
                assert _dropdown(page, ui, _property(page, ui, "on_budget", False), "on_budget") == (
                    "drain",
                    ["drain", "cancel"],
                )
                assert _dropdown(page, ui, _property(page, ui, "terminal_env", False), "terminal_env") == (
                    "default",
                    ["default", "local", "docker", "singularity", "modal"],
                )
                page.screenshot(path=str(artifacts / f"run-form-{ui}.png"))
                reply = _submit(page)
                assert reply.status == 201, reply.text()  # the server's schema check passed
                created[ui] = reply.json()
                page.close()
        finally:
            browser.close()

    for ui, run in created.items():
        params = run["parameters"]  # prefect.yaml's run_name, the schema's defaults
        assert (params["run_name"], params["on_budget"]) == ("on-demand", "drain"), ui
        unset = (params["terminal_env"], params["provider_sort"], params["reasoning_effort"])
        assert unset == ("default",) * 3, ui
        assert (
            run["state"]["type"] == "SCHEDULED" and run["state"]["state_details"]["scheduled_time"] >= "2100"
        )
        assert _delete(f"{stack.api}/flow_runs/{run['id']}") == 204
    for ui in UIS:
        assert (artifacts / f"run-form-{ui}.png").stat().st_size > 20_000


def _delete(url: str, attempts: int = 10) -> int:
    """DELETE ``url``; a 503 (the server busy, as Prefect's own client retries it) is tried again, 1 s apart."""
    for _ in range(attempts - 1):
        status = httpx.delete(url, timeout=30).status_code
        if status != 503:
            return status
        time.sleep(1)
    return httpx.delete(url, timeout=30).status_code


def _deployment_run(stack, *params: str) -> subprocess.CompletedProcess:
    """``prefect deployment run 'generate-trajectories/generate'`` with ``--param`` values as typed."""
    flags = [arg for param in params for arg in ("--param", param)]
    return subprocess.run(
        [shutil.which("prefect"), "deployment", "run", "generate-trajectories/generate", *flags],
        env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_fixed_values_from_the_command_line_and_a_run_begun_with_none(stack, mock_server, tmp_path):
    """A Python caller passes None (what ``options()`` gave before the dropdowns); the run is then
    resumed through the deployment with ``default`` and typed values, and its settings still match."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.generate import generate_trajectories

    prompts = [f"form values prompt {i} ({stack.port})" for i in range(4)]
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    common = {"dataset_file": str(dataset), "batch_size": 2, "run_name": "begun-with-none",
              "model": "mock/scripted", "base_url": mock_server.base_url,
              "distribution": "terminal_only", "output_dir": str(tmp_path / "data")}  # fmt: skip
    with temporary_settings({PREFECT_API_URL: stack.api}):
        state = generate_trajectories(
            **common, max_samples=2, terminal_env=None, provider_sort=None, reasoning_effort=None,
            return_state=True,
        )  # fmt: skip
    assert state.is_completed(), state.message
    run_dir = tmp_path / "data" / "begun-with-none"
    before = json.loads((run_dir / "run.json").read_text())
    assert before["defining"]["reasoning_effort"] is None
    requests = lambda: [model_requests(mock_server, p) for p in prompts]  # noqa: E731
    assert requests() == [3, 3, 0, 0]

    typed = [f"{key}={value}" for key, value in common.items() if key != "batch_size"] + ["batch_size=2"]
    # a value outside the list is refused by the server's schema check before any run exists
    refused = _deployment_run(stack, *typed, "resume=true", "on_budget=later")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "'later' is not one of ['drain', 'cancel']" in refused.stdout + refused.stderr

    # as a user types them: on_budget=cancel, terminal_env=local, reasoning_effort=default (not set)
    proc = _deployment_run(
        stack, *typed, "resume=true", "on_budget=cancel", "terminal_env=local", "reasoning_effort=default"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = stack.wait(re.search(r"UUID:\s*([0-9a-f-]{36})", proc.stdout).group(1))
    assert run["state"]["type"] == "COMPLETED", run["state"]
    params = run["parameters"]
    chosen = (params["on_budget"], params["terminal_env"], params["reasoning_effort"])
    assert chosen == ("cancel", "local", "default")
    after = json.loads((run_dir / "run.json").read_text())
    assert after["settings_hash"] == before["settings_hash"] and after["defining"] == before["defining"]
    assert len(after["invocations"]) == 2
    assert requests() == [3, 3, 3, 3]  # the first two were kept, the other two done now
    assert len(jsonl_rows(run_dir / "trajectories.jsonl")) == 4

    # a real change of a defining setting is still refused
    proc = _deployment_run(stack, *typed, "resume=true", "reasoning_effort=low")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = stack.wait(re.search(r"UUID:\s*([0-9a-f-]{36})", proc.stdout).group(1))
    assert run["state"]["type"] == "FAILED", run["state"]
    assert "reasoning_effort: None -> 'low'" in run["state"]["message"]
    assert requests() == [3, 3, 3, 3]
