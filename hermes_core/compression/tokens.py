"""Token counts of ShareGPT rows with a Hugging Face ``tokenizers`` tokenizer.

A row's count is the sum of its turns' counts, each turn's ``value`` encoded on its own without
special tokens (the reference ``trajectory_compressor.py`` counts the same way). It is not the
length of the row rendered with a chat template: role markers and a template's special tokens
are not counted, so leave a margin in ``--target_max_tokens`` for them (a few tokens per turn).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TOKENIZER", "TokenCounter", "TokenizerError", "load_tokenizer"]


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded; the message names the ``--tokenizer`` option and the reason."""


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens with one tokenizer; safe to share between threads.

    Attributes:
        tokenizer: a ``tokenizers.Tokenizer``.
        spec: what it was loaded from (a ``tokenizer.json`` path or a Hub id), as given.
        fingerprint: ``"sha256:<32 hex>"`` of the tokenizer's serialised JSON: the same tokenizer
            from another path gives the same fingerprint, an edited file another one.
    """

    tokenizer: Any
    spec: str
    fingerprint: str

    def count(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens added); 0 for an empty string."""
        if not text:
            return 0
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_turns(self, turns: list[dict[str, Any]]) -> list[int]:
        """Tokens of each turn's ``value`` (a missing or non-string value counts 0), in one parallel batch."""
        values = [turn.get("value") if isinstance(turn.get("value"), str) else "" for turn in turns]
        encoded = self.tokenizer.encode_batch(values, add_special_tokens=False)
        return [len(e.ids) if v else 0 for e, v in zip(encoded, values, strict=True)]


DEFAULT_TOKENIZER = "moonshotai/Kimi-K2-Thinking"
"""The tokenizer the reference ``trajectory_compressor.py`` counts with by default (a Hub id)."""


def load_tokenizer(spec: str) -> TokenCounter:
    """Load a tokenizer from a ``tokenizer.json`` file (or a folder holding one) or a Hugging Face Hub id.

    A Hub id needs the network on first use (the Hub's cache after that; ``HF_HUB_OFFLINE=1``
    uses only the cache) and a repository that ships a ``tokenizer.json``.

    Raises:
        TokenizerError: the file does not load, or the Hub id cannot be fetched (offline, unknown
            repository, no ``tokenizer.json``); the message starts with ``--tokenizer <spec>:``.
    """
    from tokenizers import Tokenizer

    if not spec or not spec.strip():
        raise TokenizerError("--tokenizer: give a tokenizer.json path or a Hugging Face Hub id")
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        if path.is_file():
            tokenizer = Tokenizer.from_file(str(path))
        elif path.suffix == ".json" or spec.startswith((".", "/")) or spec.count("/") > 1:
            raise TokenizerError(f"--tokenizer {spec}: no such file")
        else:
            tokenizer = _from_hub(spec)
    except TokenizerError:
        raise
    except Exception as exc:  # tokenizers raises plain Exception (and OSError / HTTP errors from the Hub)
        where = "the file does not load" if path.is_file() else "cannot fetch it from the Hugging Face Hub"
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(
            f"--tokenizer {spec}: {where} ({detail}); give a local tokenizer.json path when offline"
        ) from None
    digest = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()[:32]
    return TokenCounter(tokenizer, spec, f"sha256:{digest}")


def _from_hub(repo_id: str) -> Any:
    """``Tokenizer.from_pretrained(repo_id)`` with the Hub client's retry warnings kept off stderr (the
    error that follows says it all): ``HF_HUB_VERBOSITY=error`` while it runs, unless the user set it
    (the Hub client sets its log level again from that variable during the call)."""
    from tokenizers import Tokenizer

    if "HF_HUB_VERBOSITY" in os.environ:
        return Tokenizer.from_pretrained(repo_id)
    os.environ["HF_HUB_VERBOSITY"] = "error"
    try:
        return Tokenizer.from_pretrained(repo_id)
    finally:
        os.environ.pop("HF_HUB_VERBOSITY", None)
