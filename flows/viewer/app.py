"""The viewer's web app: a run page (summary + filtered, paginated prompt list) and a trajectory page.

Read-only, server-rendered (Jinja2, autoescaping on for every template), no script at all.
Every response carries a Content-Security-Policy that allows only the app's own stylesheet and
``data:`` images, so model output, tool output and web content shown in a page can neither run
nor load anything. A request whose ``Host`` header names another host than the viewer is bound to
(:func:`viewer_hosts`) is answered 400 by Starlette's ``TrustedHostMiddleware``: a web page whose
name was rebound to 127.0.0.1 (DNS rebinding) cannot read the run.

Routes:

* ``GET /`` - query ``status`` (kept, rejected, discarded, filtered, failed, pending), ``score``
  (passed, failed, errored: :mod:`flows.viewer.scores`), ``partial=1``,
  ``turn_limit=1``, ``tool=<name>``, ``tool_errors=1``, ``q=<text>``, ``page`` (1-based, at most
  :data:`MAX_PAGE`; past the last page shows the last one), ``per_page`` (1-500, default 50); an
  integer out of range is a 422;
* ``GET /prompt/<prompt_index>`` - one prompt; query ``sample`` (the sample index with
  ``--samples_per_prompt``, default 0) and the list's filters (previous/next follow the filtered list);
  when the run has a compressed version of the row (``trajectories_compressed.jsonl``), its figures
  and the original and compressed turns side by side (:mod:`flows.viewer.compression`);
* ``GET /static/viewer.css``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.trustedhost import TrustedHostMiddleware

from flows.viewer import compression
from flows.viewer.index import STATUS_LABELS, STATUSES, Filters, RunIndex
from flows.viewer.render import pretty, row_facts, score_views, turn_views
from flows.viewer.scores import OUTCOME_LABELS, OUTCOMES
from hermes_core.redaction import redactor
from hermes_core.runfolder.summary import read_summary
from hermes_core.tools import ALL_POSSIBLE_TOOLS

__all__ = ["CONTENT_SECURITY_POLICY", "MAX_PAGE", "create_app", "viewer_hosts"]

HERE = Path(__file__).resolve().parent
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""Sent with every response: no script, no remote resource, forms only to the viewer itself."""

DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 500
MAX_SAMPLE = 1_000_000
"""The largest ``sample`` accepted (422 above)."""
MAX_PAGE = 1_000_000_000
"""The largest ``page`` accepted (422 above): ``page * per_page`` stays far inside a 64-bit offset."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_ANY_ADDRESS = ("", "0.0.0.0", "::")


def viewer_hosts(host: str, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` names (without port) the viewer bound to ``host`` answers to.

    Always ``127.0.0.1``, ``localhost`` and ``[::1]``, and the bound address itself (an IPv6
    address in brackets); bound to every interface (``0.0.0.0``, ``::``), also this machine's
    host name and fully qualified name; then ``extra`` (names a proxy or the LAN uses).

    Returns:
        Lower-case names, without duplicates, in that order.
    """
    names = [*LOOPBACK_NAMES]
    try:
        names.append(f"[{host}]" if ipaddress.ip_address(host).version == 6 else host)
    except ValueError:
        names.append(host)  # a host name (e.g. localhost, a LAN name)
    if host in _ANY_ADDRESS:
        names += [socket.gethostname(), socket.getfqdn()]
    names += list(extra)
    return list(dict.fromkeys(name.lower() for name in names if name and name not in _ANY_ADDRESS))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
    )
    env.globals["status_labels"] = STATUS_LABELS
    env.globals["outcome_labels"] = OUTCOME_LABELS
    return env


def _filters(
    status: str = "",
    score: str = "",
    partial: bool = False,
    turn_limit: bool = False,
    tool: str = "",
    tool_errors: bool = False,
    q: str = "",
) -> Filters:
    """The list filters of a request's query string (a FastAPI dependency of both pages).

    Raises:
        HTTPException: 400 for an unknown status or score outcome.
    """
    if status and status not in STATUSES:
        raise HTTPException(400, f"unknown status {status!r} (one of {', '.join(STATUSES)})")
    if score and score not in OUTCOMES:
        raise HTTPException(400, f"unknown score {score!r} (one of {', '.join(OUTCOMES)})")
    return Filters(
        status=status,
        score=score,
        partial=partial,
        turn_limit=turn_limit,
        tool=tool,
        tool_errors=tool_errors,
        q=q.strip(),
    )


FilterParams = Annotated[Filters, Depends(_filters)]
"""A page's list filters, read from its query string by :func:`_filters`."""


def _query(filters: Filters, **extra: Any) -> str:
    """The query string of ``filters`` (only the fields set) plus ``extra``."""
    params: dict[str, Any] = {}
    for name in ("status", "score", "tool", "q"):
        if getattr(filters, name):
            params[name] = getattr(filters, name)
    for name in ("partial", "turn_limit", "tool_errors"):
        if getattr(filters, name):
            params[name] = "1"
    params.update({k: v for k, v in extra.items() if v is not None})
    return urlencode(params)


def _prompt_href(filters: Filters, prompt_index: int, sample_index: int | None) -> str:
    """The link to a prompt's page that keeps ``filters`` (``sample`` only when not 0)."""
    query = _query(filters, sample=sample_index or None)
    return f"/prompt/{prompt_index}" + (f"?{query}" if query else "")


def create_app(
    run_dir: Path,
    *,
    dataset: Path | None = None,
    index: RunIndex | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
) -> FastAPI:
    """The viewer of one run folder.

    Args:
        run_dir: the run folder (``data/<run_name>``).
        dataset: the dataset file when run.json's path does not lead to it.
        index: an already opened index (built from ``run_dir`` when None).
        host: the address the server is bound to; the ``Host`` names answered are
            :func:`viewer_hosts` of it (any other: 400).
        allowed_hosts: more ``Host`` names to answer (see :func:`viewer_hosts`).

    Raises:
        flows.viewer.index.RunIndexError: ``run_dir`` is not a run folder.
    """
    run_dir = Path(run_dir)
    index = index or RunIndex.open(run_dir, valid_tools=ALL_POSSIBLE_TOOLS, dataset=dataset)
    templates = Jinja2Templates(env=_environment())
    app = FastAPI(title="hermes-batch viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(
        TrustedHostMiddleware, allowed_hosts=viewer_hosts(host, allowed_hosts), www_redirect=False
    )

    @app.middleware("http")  # added last, so it runs first: the Host refusal carries the headers too
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.get("/", response_class=HTMLResponse)
    def run_page(
        request: Request,
        filters: FilterParams,
        page: int = Query(1, ge=1, le=MAX_PAGE),
        per_page: int = Query(DEFAULT_PER_PAGE, ge=1, le=MAX_PER_PAGE),
    ):
        entries, total = index.page(filters, page, per_page)
        pages = max(1, -(-total // per_page))
        if page > pages:  # past the end (or the list shrank): the last page
            page = pages
            entries, total = index.page(filters, page, per_page)
        summary = read_summary(run_dir)
        context = {
            "summary": summary,
            "counts": index.counts(),
            "notes": index.notes,
            "tools": index.tools_used(),
            "filters": filters,
            "entries": entries,
            "total": total,
            "page": page,
            "pages": pages,
            "query": _query(filters),
            "prev_page": _query(filters, page=page - 1, per_page=per_page) if page > 1 else None,
            "next_page": _query(filters, page=page + 1, per_page=per_page) if page < pages else None,
            "statuses": STATUSES,
            "outcomes": OUTCOMES,
            "score_counts": index.score_counts(),
            "samples": int(index.info.get("samples_per_prompt") or 1),
            "compression": compression.summary_text(index.compression) if index.compression else None,
            "href": lambda e: _prompt_href(filters, e["prompt_index"], e["sample_index"]),
        }
        return templates.TemplateResponse(request, "run.html", context)

    @app.get("/prompt/{prompt_index}", response_class=HTMLResponse)
    def trajectory_page(
        request: Request,
        prompt_index: int,
        filters: FilterParams,
        sample: int = Query(0, ge=0, le=MAX_SAMPLE),
    ):
        entry = index.entry(prompt_index, sample)
        if entry is None:
            what = f"prompt {prompt_index}" + (f" sample {sample}" if sample else "")
            raise HTTPException(404, f"no {what} in this run")
        scrub = redactor().redact_obj
        row = index.row(entry)
        row = scrub(row) if row is not None else None
        rescored = (index.rescores(entry).get(entry["prompt_id"]) or {}).get("score", {})
        tombstone = index.tombstone(entry)
        packed = index.compressed_row(entry)
        packed = scrub(packed) if packed is not None else None
        compressed = compression.row_view(index.compression_figures(entry), row, packed)
        previous, following = index.neighbours(prompt_index, sample, filters)
        context = {
            "summary": read_summary(run_dir),
            "entry": entry,
            "row": row,
            "facts": row_facts(row) if row else [],
            "scores": score_views(row, rescored) if row else [],
            "samples": int(index.info.get("samples_per_prompt") or 1),
            "turns": turn_views(row["conversations"]) if row else [],
            "compression": compressed,
            "run_compression": compression.summary_text(index.compression) if index.compression else None,
            "prompt": "" if row else redactor().redact(index.prompt_text(prompt_index)),
            "tombstone": pretty(scrub(tombstone)) if tombstone else None,
            "failures": scrub(index.failures(entry)),
            "query": _query(filters),
            "previous": previous,
            "following": following,
            "href": lambda key: _prompt_href(filters, *key),
        }
        return templates.TemplateResponse(request, "trajectory.html", context)

    return app
