"""``hermes-batch view``: a local, read-only web viewer of a run folder (docs/view-and-export.md).

:mod:`flows.viewer.app` is the FastAPI app (server-rendered Jinja2 pages, no script),
:mod:`flows.viewer.render` turns rows into what the templates show.
"""
