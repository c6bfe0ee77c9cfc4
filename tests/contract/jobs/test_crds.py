"""The CRD layer's files: fetched once into the user cache from the pinned release tags, each
checked against its pinned sha256, skipped with a message when they cannot be had. The "GitHub"
here is a loopback HTTP server serving the upstream files from tests/upstream/crds: no test touches
the network."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nvrx_eks.jobs import crds
from nvrx_eks.jobs.crds import CRD_DIR_ENV, PINNED_CRDS, crd_files
from nvrx_eks.jobs.validate import validate_documents
from tests.conftest import UPSTREAM_CRD_DIR
from tests.support.cli_harness import run_cli
from tests.support.manifest_cases import Case


class _Upstream:
    """Serves {file name: bytes}; records every path asked for."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.requests: list[str] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                upstream.requests.append(self.path)
                body = upstream.files.get(self.path.rsplit("/", 1)[-1])
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"not found")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tag"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _upstream_files() -> dict[str, bytes]:
    return {c.file_name: (UPSTREAM_CRD_DIR / c.file_name).read_bytes() for c in PINNED_CRDS}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """No NVRX_EKS_CRD_DIR: the user cache under a private XDG_CACHE_HOME."""
    monkeypatch.delenv(CRD_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "nvrx-eks" / "crds"


def _point_at(monkeypatch, base_url: str) -> None:
    pinned = tuple(dataclasses.replace(c, url=f"{base_url}/{c.file_name}") for c in PINNED_CRDS)
    monkeypatch.setattr(crds, "PINNED_CRDS", pinned)


@pytest.fixture
def upstream(monkeypatch):
    server = _Upstream(_upstream_files())
    _point_at(monkeypatch, server.url)
    yield server
    server.close()


def test_pins_are_the_upstream_files():
    for crd in PINNED_CRDS:
        assert hashlib.sha256((UPSTREAM_CRD_DIR / crd.file_name).read_bytes()).hexdigest() == crd.sha256
        assert crd.url.startswith("https://raw.githubusercontent.com/")
    assert "/v0.12.0/" in PINNED_CRDS[0].url and "/v1.9.4/" in PINNED_CRDS[1].url


def test_first_use_fetches_into_the_user_cache_then_reuses_it(cache, upstream):
    documents = Case("p5", "jobset", 2).render().documents
    documents[1]["spec"]["failurPolicy"] = {}  # only the CRD layer sees this
    report = validate_documents(documents, Case("p5", "jobset", 2).expectations())
    assert report.skipped == []
    assert ("crd", "spec.failurPolicy") in [(f.layer, f.path) for f in report.errors]
    assert sorted(p.name for p in cache.iterdir()) == sorted(c.file_name for c in PINNED_CRDS)
    assert len(upstream.requests) == len(PINNED_CRDS)
    assert crd_files().skipped is None
    assert len(upstream.requests) == len(PINNED_CRDS)  # cached: nothing fetched again


def test_offline_first_use_skips_the_layer_and_says_how_to_fix(cache, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _point_at(monkeypatch, f"http://127.0.0.1:{port}")
    result = run_cli("validate", "--nodes", "2")
    assert result.code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "CRD schema layer skipped: could not download" in out
    assert "run again with network access" in out and CRD_DIR_ENV in out
    assert "3 document(s) checked (kubernetes, project): valid" in out


def test_altered_download_is_refused_and_not_cached(cache, upstream):
    name = PINNED_CRDS[0].file_name
    upstream.files[name] = upstream.files[name].replace(b"maxRestarts", b"maxRestartz")
    files = crd_files()
    assert files.paths == () and "does not match its pinned sha256" in files.skipped
    assert not (cache / name).exists()


def test_damaged_cache_file_is_fetched_again(cache, upstream):
    assert crd_files().skipped is None
    (cache / PINNED_CRDS[1].file_name).write_text("truncated")
    assert crd_files().skipped is None
    assert upstream.requests[-1].endswith(PINNED_CRDS[1].file_name)
    assert hashlib.sha256((cache / PINNED_CRDS[1].file_name).read_bytes()).hexdigest() == PINNED_CRDS[1].sha256


def test_configured_folder_is_used_as_is_and_checked(monkeypatch, tmp_path):
    for name, data in _upstream_files().items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.setenv(CRD_DIR_ENV, str(tmp_path))
    assert crd_files().paths == tuple(tmp_path / c.file_name for c in PINNED_CRDS)
    (tmp_path / PINNED_CRDS[0].file_name).write_bytes(b"kind: Secret\n")
    skipped = crd_files().skipped
    assert PINNED_CRDS[0].file_name in skipped and "not the pinned upstream file" in skipped
