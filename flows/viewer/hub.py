"""Upload an exported dataset folder to the Hugging Face Hub (``huggingface_hub``, the ``hub`` extra).

The token comes from ``HF_TOKEN`` and the endpoint from ``HF_ENDPOINT`` (default: the Hub),
as ``huggingface_hub`` itself reads them; the repo is a dataset repo, created when missing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HubError", "push_folder"]


class HubError(RuntimeError):
    """The upload failed or cannot start (no token, library missing, HTTP error); one line."""


def push_folder(folder: Path, repo_id: str, *, commit_message: str | None = None) -> str:
    """Create the dataset repo ``repo_id`` if needed and upload every file of ``folder`` in one commit.

    Returns:
        The commit URL.

    Raises:
        HubError: ``HF_TOKEN`` is not set, ``huggingface_hub`` is not installed, or the Hub
            answered an error (its message is kept).
    """
    token = os.environ.get("HF_TOKEN")
    if not token:
        raise HubError("HF_TOKEN is not set (a write token of the Hub account)")
    import httpx

    from flows.viewer.export import MANIFEST

    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise HubError("huggingface_hub is not installed: pip install 'hermes-batch[hub]'") from None
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            repo_type="dataset",
            folder_path=str(folder),
            ignore_patterns=[MANIFEST],  # local bookkeeping of --overwrite, not data
            commit_message=commit_message or f"Upload {Path(folder).name} exported by hermes-batch",
        )
    except (HfHubHTTPError, httpx.HTTPError, OSError, ValueError) as exc:
        raise HubError(" ".join(str(exc).split())) from None
    return str(getattr(info, "commit_url", info))
