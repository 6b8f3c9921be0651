"""A local HTTP server that speaks the part of the Hugging Face Hub protocol huggingface_hub uses to fetch model and
dataset snapshots, so tests run the real client (HF_ENDPOINT=http://127.0.0.1:PORT) with no network.

What huggingface_hub 2.x requests (read from its source: hf_api.py repo_info/model_info/dataset_info and
_iter_repo_tree_pages, file_download.py get_hf_file_metadata/http_get, utils/_http.py hf_raise_for_status):

  GET  /api/{models|datasets}/{repo}[/revision/{rev}][?blobs=true]   repo info: id, sha, gated, siblings
  GET  /api/{models|datasets}/{repo}/tree/{rev}?recursive=...       the file listing (type, path, size, oid)
  HEAD /{repo}/resolve/{rev}/{file}, /datasets/{repo}/resolve/...   X-Repo-Commit, ETag, Content-Length
  GET  the same                                                     the bytes (a Range request resumes: 206)

Errors carry the hub's headers: X-Error-Code RepoNotFound (404, or 401 for a private repo without its token),
GatedRepo (401 without a token, 403 with one that was not granted access), EntryNotFound (404). A gated repo's
metadata is public (as on the hub); its files are not. A file can be cut off mid-transfer once (drop_at), to see
the client resume it with a Range request. Loopback only; one thread per request, daemon threads.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False                 # files need a token that `granted` holds
    private: bool = False               # everything needs a token that `granted` holds
    granted: tuple[str, ...] = ()       # tokens with access
    drop_at: dict[str, int] = field(default_factory=dict)   # file → bytes after which its first GET is cut off

    def __post_init__(self) -> None:
        """Blob ids and the commit, once (hashing per request would time a large file's requests out)."""
        self.oids = {name: hashlib.sha1(data).hexdigest() for name, data in self.files.items()}
        self.sha = hashlib.sha1("".join(f"{n}\0{o}\n" for n, o in sorted(self.oids.items())).encode()).hexdigest()


@dataclass
class Hub:
    """repos: {"models/ORG/NAME" | "datasets/ORG/NAME": Repo}; requests: (method, path) of every request seen."""
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    ranges: list[tuple[str, str]] = field(default_factory=list)       # (path, Range header) of resumed GETs
    server: ThreadingHTTPServer | None = None

    def add(self, kind: str, repo_id: str, folder_or_files: Path | dict[str, bytes], **kw) -> Repo:
        if isinstance(folder_or_files, Path):
            files = {p.relative_to(folder_or_files).as_posix(): p.read_bytes()
                     for p in sorted(folder_or_files.rglob("*")) if p.is_file()}
        else:
            files = dict(folder_or_files)
        repo = Repo(files, **kw)
        self.repos[f"{kind}/{repo_id}"] = repo
        return repo

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "Hub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:       # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    # ---- answers ---------------------------------------------------------------------------------------------
    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)) if "Content-Length" not in (headers or {}) else
                         (headers or {})["Content-Length"])
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, code: int, error_code: str, message: str, head: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": error_code, "X-Error-Message": message, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(code, json.dumps({"error": message}).encode(), headers, head)

    def _json(self, obj, head: bool) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else None

    # ---- routing ---------------------------------------------------------------------------------------------
    def _serve(self, head: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.hub.requests.append((self.command, self.path))
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            return self._api(parts[1], parts[2:], head)
        kind = "models"
        if parts[:1] == ["datasets"]:
            kind, parts = "datasets", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(kind, "/".join(parts[:2]), "/".join(parts[4:]), head)
        self._error(404, "EntryNotFound", f"no route {path}", head)

    def _repo(self, kind: str, repo_id: str, head: bool, files: bool) -> Repo | None:
        """The repo when this request may see it (its metadata, or with files=True its files), else the hub's
        error answer (and None)."""
        repo = self.hub.repos.get(f"{kind}/{repo_id}")
        token = self._token()
        if repo is None or (repo.private and token not in repo.granted):
            code = 401 if repo is not None and token is None else 404
            self._error(code, "RepoNotFound", "Repository not found", head)
            return None
        if files and repo.gated and token not in repo.granted:
            self._error(401 if token is None else 403, "GatedRepo",
                        f"Access to {kind[:-1]} {repo_id} is restricted. You must have access to it and be "
                        "authenticated to access it. Please log in.", head)
            return None
        return repo

    def _api(self, kind: str, rest: list[str], head: bool) -> None:
        repo_id = "/".join(rest[:2])
        repo = self._repo(kind, repo_id, head, files=False)
        if repo is None:
            return
        tail = rest[2:]
        if tail[:1] == ["tree"]:
            self._json([{"type": "file", "path": name, "size": len(data), "oid": repo.oids[name]}
                        for name, data in sorted(repo.files.items())], head)
            return
        if tail and tail[:1] != ["revision"]:
            self._error(404, "EntryNotFound", "no such api route", head)
            return
        self._json({"id": repo_id, "sha": repo.sha, "private": repo.private,
                    "gated": "manual" if repo.gated else False, "disabled": False,
                    "siblings": [{"rfilename": name, "size": len(data), "blobId": repo.oids[name]}
                                 for name, data in sorted(repo.files.items())]}, head)

    def _resolve(self, kind: str, repo_id: str, filename: str, head: bool) -> None:
        repo = self._repo(kind, repo_id, head, files=True)
        if repo is None:
            return
        data = repo.files.get(filename)
        if data is None:
            self._error(404, "EntryNotFound", f"{filename} does not exist", head, commit=repo.sha)
            return
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.oids[filename]}"',
                   "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        rng = self.headers.get("Range")
        cut = repo.drop_at.pop(filename, None) if not head and not rng else None
        if cut is not None:                 # a connection that drops mid-file: headers, part of the body, closed
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if rng and rng.startswith("bytes=") and not head:
            self.hub.ranges.append((self.path, rng))
            start = int(rng[len("bytes="):].split("-")[0] or 0)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206, data[start:], headers)
            return
        self._send(200, data, headers, head)
