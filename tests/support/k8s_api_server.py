"""A small Kubernetes API server for tests: real HTTP on loopback, spoken to by the real
`kubernetes` Python client. One module, over 500 lines, because the semantics below hold together:
splitting the handlers from the store would only add an interface for tests to mock.

It keeps objects in memory and implements the parts of the API the CLI uses, with the API
server's own semantics where the CLI depends on them:

* create (POST) with `?dryRun=All` answers with the object as it would be stored but stores
  nothing; a second create of the same name is 409 AlreadyExists; creating into a namespace that
  does not exist is 404;
* get/list (with `labelSelector` equality terms), merge-patch, delete (with cascading deletion
  of the pods and owned objects of a deleted JobSet/PyTorchJob, as the garbage collector would);
* API discovery per group/version (`/apis/<group>/<version>`): a group whose CRD is not
  installed is 404, exactly what the CLI sees on a cluster without the JobSet controller;
* pod logs, including `follow=true` streaming;
* every request is recorded (method, path, query, body, headers) so tests can assert on what
  the client sent, e.g. the dry-run and strict field validation parameters and the bearer token.

Errors (`Status` objects) can be injected per method and path to exercise failure paths.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from nvrx_eks.facts.job_kinds import JOB_KINDS, JOBSET

#: group/version -> {plural: (kind, namespaced)} for everything this server can store.
RESOURCES: dict[str, dict[str, tuple[str, bool]]] = {
    "v1": {
        "namespaces": ("Namespace", False),
        "configmaps": ("ConfigMap", True),
        "pods": ("Pod", True),
        "services": ("Service", True),
        "persistentvolumeclaims": ("PersistentVolumeClaim", True),
        "persistentvolumes": ("PersistentVolume", False),
        "events": ("Event", True),
    },
    "batch/v1": {"jobs": ("Job", True)},
    "networking.k8s.io/v1": {"networkpolicies": ("NetworkPolicy", True)},
    **{k.api_version: {k.plural: (k.kind, True)} for k in JOB_KINDS.values()},
}

#: Group/versions every cluster serves; the others exist only once their CRD is installed.
_BUILT_IN = ("v1", "batch/v1", "networking.k8s.io/v1")

#: Kinds whose delete answers with a Status rather than the deleted object.
_STATUS_ON_DELETE = {"ConfigMap", "Service", "Event", "Namespace"}

#: Labels by which the controllers mark the pods of a job: used for cascading deletion.
_POD_OWNER_LABELS = {k.kind: k.pod_label for k in JOB_KINDS.values()}


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: object
    headers: dict[str, str]

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass
class InjectedError:
    method: str
    path_pattern: str
    code: int
    reason: str
    message: str
    times: int = 1
    #: Let this many matching requests through first (e.g. fail the create after its dry run).
    after: int = 0
    #: Only requests whose dryRun parameter is this ("All") or absent (None); "any" matches both.
    dry_run: str | None = "any"


@dataclass
class KubeApiTestServer:
    kubernetes_version: tuple[str, str] = ("1", "35")
    #: API group/versions whose CRDs are "installed" (the _BUILT_IN ones always are).
    installed: set[str] = field(default_factory=lambda: {JOBSET.api_version})
    #: When set, requests whose Authorization header does not start with it get 401.
    required_auth_prefix: str | None = None

    def __post_init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], dict] = {}
        self.requests: list[RecordedRequest] = []
        self.errors: list[InjectedError] = []
        self.logs: dict[tuple[str, str], list[str]] = {}
        self._lock = threading.RLock()
        self._resource_version = 1000
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> KubeApiTestServer:
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> KubeApiTestServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # ----- seeding and inspection ------------------------------------------------------------

    def add(self, obj: dict) -> dict:
        """Store an object as if it had been created (assigns uid/resourceVersion)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural = _plural_for(api_version, kind)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            self._stamp(meta)
            self.objects[(api_version, plural, meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def add_namespace(self, name: str) -> None:
        self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict | None:
        with self._lock:
            return copy.deepcopy(self.objects.get((api_version, plural, namespace, name)))

    def list(self, api_version: str, plural: str, namespace: str = "") -> list[dict]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (av, pl, ns, _), o in self.objects.items()
                if av == api_version and pl == plural and (not namespace or ns == namespace)
            ]

    def set_log(self, namespace: str, pod: str, lines: list[str]) -> None:
        with self._lock:
            self.logs[(namespace, pod)] = list(lines)

    def append_log(self, namespace: str, pod: str, line: str) -> None:
        with self._lock:
            self.logs.setdefault((namespace, pod), []).append(line)

    def inject_error(
        self,
        method: str,
        path_pattern: str,
        code: int,
        reason: str,
        message: str,
        *,
        times: int = 1,
        after: int = 0,
        dry_run: str | None = "any",
    ) -> None:
        self.errors.append(InjectedError(method, path_pattern, code, reason, message, times, after, dry_run))

    def requests_to(self, method: str, path_fragment: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and path_fragment in r.path]

    # ----- internals -------------------------------------------------------------------------

    def _stamp(self, meta: dict) -> None:
        self._resource_version += 1
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        meta["resourceVersion"] = str(self._resource_version)

    def _take_error(self, method: str, path: str, dry_run: str | None) -> InjectedError | None:
        with self._lock:
            for error in self.errors:
                if error.method != method or not re.search(error.path_pattern, path) or error.times <= 0:
                    continue
                if error.dry_run != "any" and error.dry_run != dry_run:
                    continue
                if error.after > 0:
                    error.after -= 1
                    continue
                error.times -= 1
                return error
        return None


def _plural_for(api_version: str, kind: str) -> str:
    for plural, (k, _) in RESOURCES.get(api_version, {}).items():
        if k == kind:
            return plural
    raise KeyError(f"this test server does not store {kind} ({api_version})")


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _matches_selector(obj: dict, selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels", {}) or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?"
    r"(?:/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?)?$"
)


class _Handler(BaseHTTPRequestHandler):
    server_state: KubeApiTestServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    # -- plumbing --

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode()

    def _send(self, code: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _dispatch(self, method: str) -> None:
        state = self.server_state
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        body = self._read_body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
        with state._lock:
            state.requests.append(
                RecordedRequest(method, url.path, query, body, {k.lower(): v for k, v in self.headers.items()})
            )
        if state.required_auth_prefix and not (self.headers.get("Authorization") or "").startswith(
            state.required_auth_prefix
        ):
            return self._send(401, _status(401, "Unauthorized", "Unauthorized"))
        injected = state._take_error(method, url.path, (query.get("dryRun") or [None])[0])
        if injected:
            return self._send(injected.code, _status(injected.code, injected.reason, injected.message))
        if url.path == "/version":
            major, minor = state.kubernetes_version
            return self._send(200, {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0-eks"})
        match = _PATH.match(url.path)
        if not match:
            return self._send(404, _status(404, "NotFound", f"the server could not find {url.path}"))
        api_version = "v1" if match["core"] else f"{match['group']}/{match['version']}"
        if api_version not in RESOURCES or (api_version not in _BUILT_IN and api_version not in state.installed):
            return self._send(
                404, _status(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            )
        plural = match["plural"]
        if plural is None:
            if method != "GET":
                return self._send(405, _status(405, "MethodNotAllowed", "discovery is read-only"))
            resources = [
                {
                    "name": p,
                    "singularName": k.lower(),
                    "kind": k,
                    "namespaced": n,
                    "verbs": ["create", "delete", "get", "list", "patch"],
                }
                for p, (k, n) in RESOURCES[api_version].items()
            ]
            return self._send(200, {"kind": "APIResourceList", "groupVersion": api_version, "resources": resources})
        if plural not in RESOURCES[api_version]:
            return self._send(404, _status(404, "NotFound", f"unknown resource {plural}"))
        kind, namespaced = RESOURCES[api_version][plural]
        namespace = match["ns"] or ""
        if namespaced != bool(namespace) and not (namespaced and match["name"] is None and method == "GET"):
            return self._send(404, _status(404, "NotFound", f"{plural} scope mismatch"))
        name, sub = match["name"], match["sub"]
        if sub == "log" and plural == "pods" and method == "GET":
            return self._pod_log(namespace, name, query)
        if sub is not None:
            return self._send(404, _status(404, "NotFound", f"subresource {sub} not served"))
        handler = getattr(self, f"_{method.lower()}")
        return handler(api_version, plural, kind, namespace, name, query, body)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # -- verbs --

    def _get(self, api_version, plural, kind, namespace, name, query, body):
        state = self.server_state
        if name:
            obj = state.get(api_version, plural, namespace, name)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            return self._send(200, obj)
        selector = (query.get("labelSelector") or [None])[0]
        items = [o for o in state.list(api_version, plural, namespace) if _matches_selector(o, selector)]
        items.sort(key=lambda o: o["metadata"]["name"])
        return self._send(
            200,
            {"apiVersion": api_version, "kind": f"{kind}List", "metadata": {"resourceVersion": "1"}, "items": items},
        )

    def _post(self, api_version, plural, kind, namespace, name, query, body):
        state = self.server_state
        if not isinstance(body, dict):
            return self._send(400, _status(400, "BadRequest", "body must be a JSON object"))
        if body.get("kind") != kind or body.get("apiVersion") != api_version:
            return self._send(
                400,
                _status(400, "BadRequest", f"the body is a {body.get('kind')} ({body.get('apiVersion')}), not {kind}"),
            )
        meta = body.setdefault("metadata", {})
        obj_name = meta.get("name")
        if not obj_name:
            return self._send(422, _status(422, "Invalid", f"{kind}: metadata.name: Required value"))
        if namespace:
            if meta.get("namespace", namespace) != namespace:
                return self._send(400, _status(400, "BadRequest", "the namespace of the object does not match the URL"))
            if state.get("v1", "namespaces", "", namespace) is None:
                return self._send(404, _status(404, "NotFound", f'namespaces "{namespace}" not found'))
            meta["namespace"] = namespace
        with state._lock:
            key = (api_version, plural, namespace, obj_name)
            if key in state.objects:
                return self._send(
                    409,
                    _status(409, "AlreadyExists", f'{plural}.{api_version.split("/")[0]} "{obj_name}" already exists'),
                )
            stored = copy.deepcopy(body)
            state._stamp(stored["metadata"])
            if (query.get("dryRun") or [None])[0] != "All":
                state.objects[key] = stored
        return self._send(201, stored)

    def _patch(self, api_version, plural, kind, namespace, name, query, body):
        state = self.server_state
        with state._lock:
            key = (api_version, plural, namespace, name)
            obj = state.objects.get(key)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            if not isinstance(body, dict):
                return self._send(400, _status(400, "BadRequest", "merge patch must be an object"))
            _merge(obj, body)
            state._stamp(obj["metadata"])
            return self._send(200, copy.deepcopy(obj))

    def _delete(self, api_version, plural, kind, namespace, name, query, body):
        state = self.server_state
        if not name:
            return self._send(405, _status(405, "MethodNotAllowed", "collection delete not served"))
        with state._lock:
            key = (api_version, plural, namespace, name)
            obj = state.objects.get(key)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            obj["metadata"].setdefault("deletionTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if not self._protected(obj):
                state.objects.pop(key)
                self._cascade(obj)
            self._release_protected()
            result = copy.deepcopy(obj)
        if kind in _STATUS_ON_DELETE:
            return self._send(
                200,
                {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "kind": plural}},
            )
        # Like the API server, most kinds answer a delete with the object as last seen.
        return self._send(200, result)

    def _protected(self, obj: dict) -> bool:
        """The storage protection finalizers: a claim mounted by a pod, or a volume bound to a
        claim, is only marked for deletion until that use ends."""
        state = self.server_state
        meta = obj["metadata"]
        if obj["kind"] == "PersistentVolumeClaim":
            for pod in state.list("v1", "pods", meta.get("namespace", "")):
                for volume in (pod.get("spec") or {}).get("volumes") or []:
                    if (volume.get("persistentVolumeClaim") or {}).get("claimName") == meta["name"]:
                        return True
        if obj["kind"] == "PersistentVolume":
            for claim in state.list("v1", "persistentvolumeclaims"):
                if (claim.get("spec") or {}).get("volumeName") == meta["name"]:
                    return True
        return False

    def _release_protected(self) -> None:
        state = self.server_state
        changed = True
        while changed:
            changed = False
            for key, obj in list(state.objects.items()):
                if obj["metadata"].get("deletionTimestamp") and not self._protected(obj):
                    state.objects.pop(key, None)
                    self._cascade(obj)
                    changed = True

    def _cascade(self, owner: dict) -> None:
        """What the garbage collector does: remove dependents (by ownerReference uid, and the
        pods a job controller labelled as belonging to the deleted job)."""
        state = self.server_state
        uid = owner["metadata"].get("uid")
        pod_label = _POD_OWNER_LABELS.get(owner["kind"])
        for key, obj in list(state.objects.items()):
            meta = obj.get("metadata", {})
            owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences", []) or [])
            labelled = (
                pod_label is not None
                and obj["kind"] == "Pod"
                and meta.get("namespace") == owner["metadata"].get("namespace")
                and (meta.get("labels") or {}).get(pod_label) == owner["metadata"]["name"]
            )
            if owned or labelled:
                state.objects.pop(key, None)

    def _pod_log(self, namespace, name, query):
        state = self.server_state
        if state.get("v1", "pods", namespace, name) is None:
            return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
        # Query booleans are parsed like Go's strconv.ParseBool: the Python client sends "True".
        follow = (query.get("follow") or ["false"])[0].lower() in ("1", "t", "true")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        deadline = time.monotonic() + 5
        while True:
            with state._lock:
                lines = list(state.logs.get((namespace, name), []))
                pod_alive = state.get("v1", "pods", namespace, name) is not None
            for line in lines[sent:]:
                data = (line + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            sent = len(lines)
            # A followed log ends when the pod goes away (or after a test-friendly deadline).
            if not follow or not pod_alive or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _merge(target: dict, patch: dict) -> None:
    """JSON merge patch (RFC 7386)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
