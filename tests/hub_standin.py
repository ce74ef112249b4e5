"""A stand-in for the Hugging Face Hub's upload endpoints, enough for ``HfApi.create_repo`` and
``HfApi.upload_folder`` without hf_xet (``HF_HUB_DISABLE_XET=1``): every file is answered
``regular`` at preupload, so its bytes come base64-encoded inside the NDJSON commit."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class HubRecord:
    """What the stand-in received."""

    repos: list[dict] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)
    files: dict[str, bytes] = field(default_factory=dict)  # path in repo -> bytes
    commits: list[dict] = field(default_factory=list)  # header values
    calls: list[str] = field(default_factory=list)


def hub_app(record: HubRecord) -> FastAPI:
    """The app; ``record`` fills as requests arrive."""
    app = FastAPI()

    @app.middleware("http")
    async def note(request: Request, call_next):
        record.calls.append(f"{request.method} {request.url.path}")
        record.authorizations.add(request.headers.get("authorization", ""))
        return await call_next(request)

    @app.post("/api/repos/create")
    async def create(request: Request):
        body = await request.json()
        record.repos.append(body)
        return {"url": f"{request.base_url}datasets/{body['organization']}/{body['name']}"}

    @app.post("/api/validate-yaml")
    async def validate_yaml(request: Request):
        return {"errors": [], "warnings": []}

    @app.post("/api/datasets/{org}/{name}/preupload/{revision}")
    async def preupload(org: str, name: str, revision: str, request: Request):
        body = await request.json()
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in body["files"]]
        return {"files": files, "commitOid": "0" * 40}

    @app.post("/api/datasets/{org}/{name}/commit/{revision}")
    async def commit(org: str, name: str, revision: str, request: Request):
        for line in (await request.body()).decode().splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                record.commits.append(item["value"])
            elif item["key"] == "file":
                record.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            else:
                return JSONResponse({"error": f"stand-in does not take {item['key']}"}, status_code=400)
        oid = "1" * 40
        return {
            "commitUrl": f"{request.base_url}datasets/{org}/{name}/commit/{oid}",
            "commitOid": oid,
            "pullRequestUrl": None,
        }

    return app
