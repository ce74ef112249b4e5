"""The Hugging Face dataset card (``README.md``) of an export: YAML front matter and a body.

The front matter has ``license``, ``tags``, ``size_categories``, ``configs`` (one ``default``
config whose ``train`` split is the Parquet shards) and ``dataset_info`` (the features and
the row count), so ``datasets.load_dataset(DIR)`` reads the shards with the declared types.
The body describes the run from run.json and statistics.json (:class:`hermes_core.runfolder.summary.RunSummary`);
a scored run gets a ``Scores`` section (:func:`scores_section`: pass@k, pass^k, each scorer's pass
rate and mean, the ``--keep`` filter, and where the scores are in a row); an export of the
compressed rows (``--compressed``) a ``Compression to a token budget`` section
(:func:`compression_section`: the budget, the tokenizer, the summariser and the totals).
The whole card passes the secret redaction.
"""

from __future__ import annotations

from typing import Any

import yaml

from hermes_core.redaction import redactor
from hermes_core.runfolder.summary import RunSummary

__all__ = ["compression_section", "render_card", "scores_section", "size_category"]

_SIZE_BUCKETS = [
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
]


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` bucket of a row count (``n<1K`` ... ``n>1B``)."""
    return next((name for limit, name in _SIZE_BUCKETS if rows < limit), "n>1B")


def _cell(value: Any) -> str:
    text = "—" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


FORMAT_TEXT = {
    "sharegpt": (
        "Each row is a trajectory exactly as in the run's `trajectories.jsonl`: `prompt_index`, "
        "`conversations` (ShareGPT `from`/`value` turns: `system` with the offered tools inside `<tools>`, "
        "`human`, `gpt` with `<think>` and `<tool_call>` blocks, `tool` with `<tool_response>` blocks), "
        "`metadata` (batch, timestamp, model, prompt_id, usage, reasoning, duration, attempt, stop reason, "
        "source), `completed` (false = the turn limit ended it), `partial`, `api_calls`, `toolsets_used`, "
        "`tool_stats` and `tool_error_counts` (every tool of the registry)."
    ),
    "messages": (
        "Each row is a trajectory as OpenAI chat messages, the form chat trainers take: `messages` "
        "(`system` with the tools prompt, `user`, `assistant` with `reasoning` and `tool_calls` "
        "`[{id, type: function, function: {name, arguments (JSON string)}}]`, `tool` with `tool_call_id` "
        "and `name`), `tools` (the offered tools as `{type: function, function: {name, description, "
        "parameters (JSON schema)}}`), plus `prompt_index`, `prompt_id`, `model`, `completed` and `partial`."
    ),
}

INCLUDE_TEXT = {
    "kept": "the rows of `trajectories.jsonl` (kept trajectories only).",
    "all": (
        "the rows of `trajectories.jsonl` plus the rows left out of it for calling a tool outside the "
        "registry (hallucinated tool), in prompt order; their `tool_stats` / `tool_error_counts` list only "
        "the registry's tools (the hallucinated calls stay in the conversation), so every row has one schema. "
        "Samples discarded for having no reasoning are not included: the run keeps no row for them, only a "
        "tombstone."
    ),
    "passed": (
        "the rows of `trajectories.jsonl` whose `metadata.passed` is true (every scorer that applied "
        "passed; re-scores of `hermes-batch score` count), in prompt order. Rows no scorer scored are not "
        "included."
    ),
}


COMPRESSED_INCLUDE_TEXT = {
    "kept": "every row of `trajectories_compressed.jsonl` (the kept trajectories compressed to a token budget).",
    "passed": (
        "the rows of `trajectories_compressed.jsonl` whose `metadata.passed` is true (every scorer that "
        "applied passed; re-scores of `hermes-batch score` count), in prompt order."
    ),
}


def compression_section(compression: dict[str, Any]) -> list[str]:
    """The card's ``## Compression to a token budget`` lines from
    :func:`flows.viewer.compression.summary_text` of ``compression_metrics.json``."""
    c = compression
    counts = c.get("counts") or []
    notice = (
        "The system turn of a compressed row gains one sentence saying that earlier turns may be summarised. "
        if c.get("notice")
        else ""
    )
    lines = [
        "## Compression to a token budget",
        "",
        f"The rows were compressed by `hermes-batch compress` to at most **{_cell(c.get('target'))} tokens** "
        f"counted with the tokenizer `{_cell(c.get('tokenizer'))}` (a row's count is the sum of its turns' "
        "values, each encoded without special tokens: a chat template's role markers are not in it). "
        "In a row over the budget, the fewest middle turns needed (whole tool call/response pairs) are "
        "replaced by one `human` turn starting with `[CONTEXT SUMMARY]:`, written by "
        f"`{_cell(c.get('summary_model'))}` (about {_cell(c.get('summary_target_tokens'))} tokens); "
        "the system turn, the first human, gpt and tool turns and the last "
        f"{_cell(c.get('protect_last_n_turns'))} turns are never replaced. {notice}"
        "Rows still over the budget after compression and rows whose summary failed are kept as they are "
        "(no made-up summary), unless dropped.",
        "",
        "| " + " | ".join(label for _, label, _ in counts) + " |",
        "|" + "---|" * len(counts),
        "| " + " | ".join(_cell(n) for _, _, n in counts) + " |",
        "",
        f"{_cell(c.get('tokens_before'))} tokens before, {_cell(c.get('tokens_after'))} after "
        f"({_cell(c.get('tokens_saved'))} saved, ratio {_cell(c.get('ratio'))}) over "
        f"{_cell(c.get('rows'))} rows of `trajectories.jsonl`; {_cell(c.get('rows_written'))} rows written, "
        f"{_cell(c.get('over_budget'))} of them over the budget (still over or failed).",
        "",
    ]
    if c.get("not_sampled"):
        lines += [
            f"Only a seeded sample of {_cell(c.get('sample_percent'))}% of the rows was compressed and written "
            f"({_cell(c.get('not_sampled'))} rows left out).",
            "",
        ]
    if c.get("target") is None:
        lines = [
            "## Compression to a token budget",
            "",
            "The rows come from `trajectories_compressed.jsonl`, but its `compression_metrics.json` was not "
            "readable: the budget and the tokenizer are not known.",
            "",
        ]
    return lines


def _rate(part: Any, whole: Any) -> str:
    return f"{100 * part / whole:.2f}%" if isinstance(part, int) and isinstance(whole, int) and whole else "—"


def scores_section(stats: dict[str, Any], fmt: str) -> list[str]:
    """The card's ``## Scores`` lines from statistics.json (``[]`` when the run has no scores)."""
    scores = stats.get("scores") or {}
    if not scores:
        return []
    where = "`metadata.score`, `metadata.passed`" if fmt == "sharegpt" else "`score`, `passed`"
    sample = "`metadata.sample_index`" if fmt == "sharegpt" else "`sample_index`"
    pass_at_k = stats.get("pass_at_k") or {}
    lines = [
        "## Scores",
        "",
        f"Each scored row has {where}: `score` holds one struct per scorer, "
        "`{value (float), passed (bool), explanation (text: the match, or the verify command's exit status "
        "and output)}`, null for a scorer that did not score the row; `passed` is true when every scorer "
        f"that applied passed. With several samples per prompt, {sample} numbers a record's samples. "
        "The figures below are of the whole run (statistics.json), not only of the rows exported.",
        "",
    ]
    if pass_at_k:
        figures = [f"pass@{k} = {_cell(p)}" for k, p in pass_at_k.items()]
        if stats.get("pass_hat_k") is not None:
            figures.append(f"pass^{max(int(k) for k in pass_at_k)} = {_cell(stats['pass_hat_k'])}")
        lines += [
            " · ".join(figures)
            + " (unbiased estimator of Chen et al. 2021, averaged over records; pass^k: the "
            "share of records whose samples all passed).",
            "",
        ]
    lines += [
        "| scorer | scored | passed | failed | pass rate | mean |",
        "|---|---|---|---|---|---|",
        *[
            f"| {_cell(name)} | {_cell(s.get('scored'))} | {_cell(s.get('passed'))} | {_cell(s.get('failed'))} | "
            f"{_rate(s.get('passed'), s.get('scored'))} | {_cell(s.get('mean'))} |"
            for name, s in scores.items()
        ],
        "",
    ]
    kept = stats.get("kept_by_filter") or {}
    if kept.get("keep") not in (None, "all"):
        lines += [
            f"Rejection sampling `--keep {kept['keep']}`: {_cell(kept.get('kept'))} rows kept, "
            f"{_cell(kept.get('rejected'))} rejected (not in this dataset).",
            "",
        ]
    return lines


def render_card(
    summary: RunSummary,
    *,
    fmt: str,
    include: str,
    rows: int,
    filtered_included: int,
    features: list[dict[str, Any]],
    data_glob: str,
    license: str | None,
    compression: dict[str, Any] | None = None,
) -> str:
    """The card text.

    Args:
        summary: the run's description.
        fmt: ``sharegpt`` or ``messages``.
        include: ``kept``, ``all`` or ``passed``.
        rows: rows in the export.
        filtered_included: rows of hallucinated-tool samples in the export (``all`` only).
        features: ``dataset_info.features`` (:func:`flows.viewer.hf_schema.features_yaml`).
        data_glob: the shards, relative to the card (e.g. ``data/train-*.parquet``).
        license: a license id; None gives ``other``.
        compression: :func:`flows.viewer.compression.summary_text` when the rows are the compressed
            ones (``export --compressed``), else None.

    Returns:
        ``---\\n<yaml>---\\n\\n<markdown>``, redacted.
    """
    stats = summary.statistics or {}
    settings = summary.settings
    front = {
        "license": license or "other",
        "tags": ["hermes-batch", "agent", "tool-use", "trajectories", "synthetic", fmt]
        + (["compressed"] if compression is not None else []),
        "size_categories": [size_category(rows)],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": data_glob}]}],
        "dataset_info": {"features": features},
    }
    reasoning = stats.get("reasoning_statistics") or {}
    tokens = stats.get("tokens") or {}
    cost = stats.get("cost_usd")
    included = COMPRESSED_INCLUDE_TEXT[include] if compression is not None else INCLUDE_TEXT[include]
    budget = (
        f" Compressed to a budget of {_cell(compression.get('target'))} tokens "
        f"(tokenizer `{_cell(compression.get('tokenizer'))}`): see below."
        if compression is not None
        else ""
    )
    lines = [
        f"# {summary.run_name}",
        "",
        f"Trajectories of the Hermes tool-using agent, generated with hermes-batch by `{settings.get('model')}` "
        f"(toolset distribution `{settings.get('distribution')}`). {rows} rows.{budget}",
        "",
        "## Contents",
        "",
        (
            FORMAT_TEXT[fmt].replace(
                "exactly as in the run's `trajectories.jsonl`",
                "as in the run's `trajectories_compressed.jsonl`",
            )
            if compression is not None
            else FORMAT_TEXT[fmt]
        )
        + (
            " The rows are those of `trajectories_compressed.jsonl`: a long row's middle turns are replaced by "
            "one `[CONTEXT SUMMARY]:` turn (see Compression to a token budget)."
            if compression is not None
            else ""
        ),
        "",
        f"Included: {included}"
        + (f" This export has {filtered_included} such rows." if include == "all" else ""),
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("<this folder or repo id>", split="train")',
        "```",
        "",
        "## Generation settings",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {_cell(k)} | {_cell(v)} |" for k, v in settings.items()],
        f"| batch_size | {_cell(stats.get('batch_size'))} |",
        f"| dataset | {_cell(summary.dataset.get('path'))} ({_cell(summary.dataset.get('records'))} records, "
        f"sha256 {_cell(summary.dataset.get('fingerprint'))}) |",
        "",
        "No API key or other secret is part of these settings or of the data: every exported value passed the "
        "run's secret redaction.",
        "",
        "## Counts",
        "",
        "| prompts | trajectories kept | discarded (no reasoning) | filtered (hallucinated tool) | failed |",
        "|---|---|---|---|---|",
        f"| {_cell(stats.get('total_prompts'))} | {_cell(stats.get('completed'))} | "
        f"{_cell(stats.get('discarded_no_reasoning'))} | {_cell(stats.get('filtered_hallucinated'))} | "
        f"{_cell(stats.get('failed'))} |",
        "",
        "## Filters applied",
        "",
        "- Samples with no reasoning in any assistant turn are discarded "
        f"({_cell(stats.get('discarded_no_reasoning'))}).",
        "- Rows calling a tool outside the registry (hallucinated tool) are left out of `trajectories.jsonl` "
        f"({_cell(stats.get('filtered_hallucinated'))})"
        + ("; this export includes them." if include == "all" else "."),
        f"- Prompts that failed after their retries have no row ({_cell(stats.get('failed'))}).",
        "- One row per prompt: a resumed run's duplicate rows are dropped.",
        "",
        "## Reasoning coverage",
        "",
        f"{_cell(reasoning.get('turns_with_reasoning'))} of {_cell(reasoning.get('total_assistant_turns'))} "
        f"assistant turns have reasoning ({_cell(reasoning.get('coverage_percent'))}%; the discarded samples' "
        "turns count as turns without).",
        "",
        "## Tool usage",
        "",
        "| tool | calls | success | failure | success % |",
        "|---|---|---|---|---|",
        *[
            f"| {_cell(t['tool'])} | {t['count']} | {t['success']} | {t['failure']} | {t['success_rate']:.2f} |"
            for t in summary.tool_usage()
        ],
        "",
        *scores_section(stats, fmt),
        *(compression_section(compression) if compression is not None else []),
        "## Tokens and cost",
        "",
        f"{_cell(tokens.get('prompt'))} prompt, {_cell(tokens.get('completion'))} completion "
        f"({_cell(tokens.get('reasoning'))} reasoning), {_cell(tokens.get('total'))} total tokens; "
        f"cost {'not reported' if cost is None else f'${cost:.4f}'}; "
        f"{_cell(stats.get('duration_seconds'))} s of generation.",
        "",
    ]
    text = "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(lines)
    return redactor().redact(text)
