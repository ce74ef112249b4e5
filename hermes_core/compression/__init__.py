"""Compress ShareGPT trajectories to a token budget (the reference ``trajectory_compressor.py``).

- :mod:`~hermes_core.compression.tokens`: the token counter (:func:`load_tokenizer`).
- :mod:`~hermes_core.compression.algorithm`: one row (:func:`compress_row`, :class:`CompressionSettings`).
- :mod:`~hermes_core.compression.summariser`: the summariser (:class:`ModelSummariser`).
- :mod:`~hermes_core.compression.batch`: a JSONL file with its per-row cache (:func:`compress_jsonl`).

README § Compressing to a token budget says what it does; no Prefect here.
"""

from hermes_core.compression.algorithm import (
    DEFAULT_TARGET_MAX_TOKENS,
    SUMMARY_NOTICE,
    CompressionSettings,
    RowResult,
    compress_row,
)
from hermes_core.compression.batch import (
    STATUSES,
    CompressionInputError,
    compress_jsonl,
    describe_compression,
)
from hermes_core.compression.summariser import (
    SUMMARY_PREFIX,
    ModelSummariser,
    Summariser,
    SummariserError,
    SummaryResult,
)
from hermes_core.compression.tokens import DEFAULT_TOKENIZER, TokenCounter, TokenizerError, load_tokenizer

__all__ = [
    "DEFAULT_TARGET_MAX_TOKENS",
    "DEFAULT_TOKENIZER",
    "STATUSES",
    "SUMMARY_NOTICE",
    "SUMMARY_PREFIX",
    "CompressionInputError",
    "CompressionSettings",
    "ModelSummariser",
    "RowResult",
    "Summariser",
    "SummariserError",
    "SummaryResult",
    "TokenCounter",
    "TokenizerError",
    "compress_jsonl",
    "compress_row",
    "describe_compression",
    "load_tokenizer",
]
