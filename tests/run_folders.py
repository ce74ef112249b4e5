"""Small run folders for the viewer and export tests, written by the product's own code.

Rows come from :func:`hermes_core.runner.build_row` over hand-written agent conversations; they
are recorded with :class:`hermes_core.runfolder.ledger.RunLedger` (rows, tombstones, failures, checkpoint),
``run.json`` comes from :mod:`hermes_core.runfolder.run_info`, ``trajectories.jsonl`` and ``statistics.json``
from :mod:`hermes_core.runfolder.postprocess` - the same calls the flow makes, so the files cannot drift from
what a real run writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flows.config import BatchConfig
from hermes_core.agent import AgentResult
from hermes_core.client import Usage
from hermes_core.dataset import read_dataset
from hermes_core.runfolder.ledger import RunLedger
from hermes_core.runfolder.postprocess import compute_statistics, merge_trajectories, write_json_atomic
from hermes_core.runfolder.run_info import finish_invocation, jobs_of, start_invocation
from hermes_core.runner import build_row
from hermes_core.tools import ALL_POSSIBLE_TOOLS

XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
"""A tool output that would run script if a page inserted it as HTML."""

LEAK = "sk-live-0123456789abcdefSECRET"
"""A credential value a ``leak`` prompt's tool prints (tests set it in a credential-named variable)."""

TERMINAL_TOOL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}

# What each prompt of the default folder becomes; the prompt text says it, so tests can search for it.
DEFAULT_PLAN = [
    ("kept", "List the files in the working directory"),
    ("xss", "Print the tricky markup string"),
    ("discarded", "Answer without any thinking"),
    ("filtered", "Call a tool that does not exist"),
    ("failed", "This prompt fails every time"),
    ("turn_limit", "Loop until the turn limit"),
    ("partial", "Cut the answer short"),
    ("tool_error", "Run a command that errors"),
    ("pending", "Never run yet"),
]

TEST_FLOW_RUN_ID = "00000000-0000-4000-8000-000000000001"
"""The flow run id the test run folders are written under."""


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(kind: str, prompt: str) -> list[dict[str, Any]]:
    """A hand-written agent conversation (OpenAI message dicts) for one kind of outcome."""
    command, output, error = "ls", "a.txt\nb.txt", None
    tool = "terminal"
    if kind == "xss":
        command, output = f"echo '{XSS}'", XSS
    elif kind == "tool_error":
        command, output, error = "cat missing", "", "cat: missing: No such file or directory"
    elif kind == "leak":
        command, output = "env", f"HOME=/root\nSERVICE_API_KEY={LEAK}"
    elif kind == "filtered":
        tool = "hallucinated_tool"
    reasoning = None if kind == "discarded" else f"I should run {command}."
    messages = [
        {"role": "user", "content": prompt},
        {
            "role": "assistant",
            "content": "Running it.",
            "reasoning": reasoning,
            "tool_calls": [_call("call_1", tool, {"command": command})],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": tool,
            "content": json.dumps({"output": output, "exit_code": 0 if error is None else 1, "error": error}),
        },
    ]
    if kind != "turn_limit":
        final = "Done: two files." if kind != "partial" else "Done: the answer was cut"
        messages.append(
            {"role": "assistant", "content": final, "reasoning": None if kind == "discarded" else "Enough."}
        )
    return messages


def build_run(
    root: Path, plan: list[tuple[str, str]] | None = None, *, run_name: str = "demo", batch_size: int = 2
) -> Path:
    """Write a finished run folder ``root/data/<run_name>`` with one prompt per ``(kind, prompt)`` of ``plan``.

    Kinds: ``kept``, ``xss`` (tool output = :data:`XSS`), ``leak`` (tool output has :data:`LEAK`), ``tool_error``, ``partial``,
    ``turn_limit`` (``completed=false``), ``filtered`` (calls ``hallucinated_tool``), ``discarded``
    (no reasoning: a tombstone), ``failed`` (a failure line), ``pending`` (nothing). The dataset
    is ``root/prompts.jsonl`` (recorded in run.json by its absolute path).

    Returns:
        The run folder.
    """
    plan = plan or DEFAULT_PLAN
    dataset = root / "prompts.jsonl"
    dataset.write_text(
        "".join(json.dumps({"prompt": p, "kind": k}) + "\n" for k, p in plan), encoding="utf-8"
    )
    config = BatchConfig.from_options(
        dataset_file=str(dataset),
        batch_size=batch_size,
        run_name=run_name,
        output_dir=str(root / "data"),
        model="mock/scripted",
        distribution="terminal_only",
    )
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ds = read_dataset(dataset)
    jobs = jobs_of(ds, config.settings_hash())
    info = start_invocation(
        run_dir, run_name, config.defining_settings(), config.settings_hash(), ds, TEST_FLOW_RUN_ID
    )
    ledger = RunLedger.open(run_dir, run_name)
    index_of = {j.prompt_id: j.prompt_index for j in jobs}
    to_run = [j for j, (kind, _) in zip(jobs, plan, strict=True) if kind != "pending"]
    ledger.plan([(j.prompt_index, j.prompt_id) for j in to_run], batch_size, index_of)
    spec = config.run_spec()
    failed = []
    for job, (kind, prompt) in zip(jobs, plan, strict=True):
        if kind == "pending":
            continue
        if kind == "failed":
            ledger.record_failure(job.prompt_id, job.prompt_index, "ModelError", "HTTP 500: <b>boom</b>", 2)
            failed.append(job.prompt_id)
            continue
        messages = conversation(kind, prompt)
        result = AgentResult(
            messages=messages,
            tools=[TERMINAL_TOOL],
            api_calls=sum(1 for m in messages if m["role"] == "assistant"),
            completed=kind != "turn_limit",
            partial=kind == "partial",
            stop_reason={"turn_limit": "TurnLimitReached", "partial": "OutputTruncated"}.get(
                kind, "final_answer"
            ),
            usage=Usage(prompt_tokens=100, completion_tokens=20, reasoning_tokens=5, cost=0.001),
            duration_s=0.25,
        )
        row = build_row(job, spec, result, ["terminal"], attempt=1, duration_s=0.25)
        if kind == "discarded":
            ledger.record_discard(
                job.prompt_id,
                {"prompt_index": job.prompt_index, "assistant_turns": 2, "usage": result.usage.as_dict()},
            )
        else:
            ledger.record_row(job.prompt_id, row)
    ledger.write_checkpoint()
    ledger.close()
    merge = merge_trajectories(run_dir, index_of=index_of, valid_tools=ALL_POSSIBLE_TOOLS)
    finish_invocation(info, duration_s=1.5, ran=len(to_run), failed=len(failed))
    stats = compute_statistics(
        run_dir,
        merge=merge,
        run_name=run_name,
        distribution=config.distribution,
        model=config.model,
        batch_size=batch_size,
        index_of=index_of,
        duration_seconds=1.5,
        failed_prompt_ids=failed,
        valid_tools=ALL_POSSIBLE_TOOLS,
        flow_run_id=TEST_FLOW_RUN_ID,
    )
    write_json_atomic(run_dir / "statistics.json", stats)
    return run_dir
