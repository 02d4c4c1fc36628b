"""The one typed wire between the controller and the agent: a request and a result
dataclass per agent operation, with `to_json` / `from_json`.

Standard library only, and readable by Python 3.8 (the agent runs on hosts with only
their python3): annotations use `typing.Optional/List/Dict`, resolved by
`typing.get_type_hints`. JSON exists only here; both sides hand the dataclasses around.

Every request and result is a `message.Message`: `from_json` checks exact types down to
the leaves and names the field it refuses. The records they carry are records.py's. The
values still free-form (a deploy's role specs and records, the bisect record, adopt's
state, the audit's raw facts) are `dict`: the parts that read them check them.

Adding an op: one Request subclass, one Result subclass, one entry in OPS (an `Op`: the
part of the host program that serves it and the function there).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, List, Optional, Type, Union

# Re-exported: the ops' callers read the envelope and its errors from the wire module.
from .message import Failure as Failure, Message as Message, Result as Result
from .message import WireError as WireError, _kind
from .protocol import PROTOCOL
from .records import BaseSource, PatchSpec, Recovered, StatusRecord, TensorPattern


# ---------------------------------------------------------------- requests

@dataclasses.dataclass
class Request(Message):
    """What every request holds; the transport fills in `target` (and `tree`, `python`)."""

    op: ClassVar[str] = ""
    target: str = ""                  # the tree on the host (the transport's)
    tree: str = ""                    # deploy/facts/audit: the tree the units serve
    python: Optional[str] = None      # the server's interpreter (inventory)
    tool_version: str = "?"
    git_prefix: str = "python/"
    package: str = "sglang"


@dataclasses.dataclass
class TreeChangeRequest(Request):
    """apply and revert: the series as the controller knows it."""

    lock_wait: float = 0.0
    dry_run: bool = False
    bisect: Optional[str] = None      # the bisect this change is a step of
    patches: List[PatchSpec] = dataclasses.field(default_factory=list)   # the desired series
    base_files: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
    upstream: Optional[Dict[str, str]] = None      # {"name", "version"} of the pin


@dataclasses.dataclass
class ApplyRequest(TreeChangeRequest):
    op: ClassVar[str] = "apply"
    provision: bool = False
    base: BaseSource = dataclasses.field(default_factory=BaseSource)


@dataclasses.dataclass
class RevertRequest(TreeChangeRequest):
    op: ClassVar[str] = "revert"
    names: List[str] = dataclasses.field(default_factory=list)
    with_dependents: bool = False


@dataclasses.dataclass
class StatusRequest(Request):
    op: ClassVar[str] = "status"


@dataclasses.dataclass
class CaptureRequest(Request):
    op: ClassVar[str] = "capture"
    lock_wait: float = 0.0


@dataclasses.dataclass
class BisectMarkRequest(Request):
    op: ClassVar[str] = "bisect-mark"
    lock_wait: float = 0.0
    bisect: Optional[str] = None
    record: Optional[Dict[str, Any]] = None       # None: drop the record


@dataclasses.dataclass
class FactsRequest(Request):
    op: ClassVar[str] = "facts"
    roles: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DeployRequest(Request):
    op: ClassVar[str] = "deploy"
    roles: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)  # restart order
    state_sha256: str = ""
    lock_wait: float = 0.0
    bisect: Optional[str] = None
    redact: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class AuditRequest(Request):
    op: ClassVar[str] = "audit"
    format: int = 1
    tensors: List[TensorPattern] = dataclasses.field(default_factory=list)
    run_timeout: Optional[float] = None           # None: the runner's default
    http_timeout: Optional[float] = None
    unit_pattern: Optional[str] = None
    units: List[str] = dataclasses.field(default_factory=list)
    max_shards: int = 64                          # checkpoint shards read per model



@dataclasses.dataclass
class InventoryRequest(Request):
    """adopt's read of an unmanaged tree: every served package file, git facts."""

    op: ClassVar[str] = "inventory"
    checkout: Optional[str] = None       # a git checkout the served tree was installed from
    pin_commit: Optional[str] = None     # the manifest's base commit, for the merge-base
    read: List[str] = dataclasses.field(default_factory=list)   # git paths: bytes wanted


@dataclasses.dataclass
class AdoptRequest(Request):
    """adopt --write: record the management state of a tree without changing a served byte."""

    op: ClassVar[str] = "adopt"
    state: Dict[str, Any] = dataclasses.field(default_factory=dict)   # the TreeState
    expected: Dict[str, str] = dataclasses.field(default_factory=dict)  # path -> blob planned
    patches: List[str] = dataclasses.field(default_factory=list)       # bundle names (kept)
    base_objects: List[str] = dataclasses.field(default_factory=list)  # base/<blob> names

# ---------------------------------------------------------------- results

@dataclasses.dataclass
class TreeResult(Result):
    """What the engine adds to every op it runs under the tree lock."""

    recovered: Optional[Recovered] = None         # the interrupted work it finished first
    provisioned: Optional[str] = None             # apply: where a missing tree came from


@dataclasses.dataclass
class ApplyResult(TreeResult):
    changed: bool = False
    before: List[str] = dataclasses.field(default_factory=list)
    after: List[str] = dataclasses.field(default_factory=list)
    head: Optional[str] = None
    target: Optional[str] = None
    dry_run: bool = False


@dataclasses.dataclass
class RevertResult(ApplyResult):
    reverted: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CaptureResult(TreeResult):
    target: str = ""
    diff: str = ""
    files: Dict[str, Dict[str, Optional[str]]] = dataclasses.field(default_factory=dict)  # {pre, post}
    applied: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class BisectMarkResult(TreeResult):
    bisect: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class FactsResult(Result):
    root: bool = False                             # the agent runs as root
    systemd: bool = False
    tree: Optional[Dict[str, Any]] = None          # None: no tree there
    roles: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    interrupted: Optional[Dict[str, Any]] = None   # a deploy transaction left behind


@dataclasses.dataclass
class DeployResult(Result):
    deployed: bool = False
    changed: bool = False
    actions: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    restart_reasons: Dict[str, Any] = dataclasses.field(default_factory=dict)
    failed: Optional[Dict[str, Any]] = None
    rollback: Optional[List[Dict[str, Any]]] = None
    recovered: Optional[List[Dict[str, Any]]] = None


@dataclasses.dataclass
class AuditResult(Result):
    format: int = 1
    gatherer: str = ""
    hostname: str = ""
    uid: int = -1
    duration_ms: float = 0.0
    raw: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Commit(Message):
    """One first-parent commit after the base: its id, message and diff to its parent."""

    commit: str
    subject: str
    body: str
    diff: str                        # package paths only, --full-index, git layout
    author: str = ""                 # Name <email>
    files: List[str] = dataclasses.field(default_factory=list)   # git paths it changes


@dataclasses.dataclass
class GitFacts(Message):
    root: str
    head: str
    base: Optional[str]              # merge-base of HEAD and the pin commit (None: unknown)
    base_why: str                    # how the base was found, or why not
    commits: List[Commit]
    head_files: Dict[str, str]       # git path -> blob at HEAD (package files)
    dirty: List[str]                 # uncommitted changes in the checkout
    more_commits: int = 0            # package commits after the base past the limit: unlisted


@dataclasses.dataclass
class InventoryResult(Result):
    target: str = ""
    kind: str = ""                   # git | plain
    layout: str = ""                 # git | wheel
    managed: bool = False
    files: Dict[str, str] = dataclasses.field(default_factory=dict)  # path -> blob id
    git: Optional[GitFacts] = None
    served: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)  # latin-1
    at_head: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
    special: Dict[str, str] = dataclasses.field(default_factory=dict)  # path -> a link, ...
    executable: List[str] = dataclasses.field(default_factory=list)    # regular, mode +x
    not_read: Dict[str, str] = dataclasses.field(default_factory=dict)  # asked, refused: why
    deferred: List[str] = dataclasses.field(default_factory=list)       # asked: next request


@dataclasses.dataclass
class AdoptResult(Result):
    target: str = ""
    files_hashed: int = 0
    identical: bool = False          # every served byte the same before and after
    applied: List[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------- the op table

@dataclasses.dataclass(frozen=True)
class Op:
    """One agent operation, declared once: what it takes and returns, which part of the
    host program serves it (a module of patchset/agent, whose `serve(request, bundle,
    events)` is the part's frame: its lock, its error mapping) and the function there that
    does the op. The controller sends by it, the agent dispatches by it, the docs list it."""

    name: str
    request: Type["Request"]
    result: Type["Result"]
    part: str                 # the module of patchset/agent that serves it
    function: str             # the op's function in that module
    serves: str               # how errors name the part ("the engine")
    isolated: bool = False    # runs in a process of its own even for a local tree (a
                              # deploy's transaction must outlive a Ctrl-C of the CLI)


_ENGINE, _DEPLOYER, _GATHERER, _ADOPTER = "the engine", "the deploy runner", "the gatherer", \
    "the adopter"
OPS: Dict[str, Op] = {op.name: op for op in (
    Op("apply", ApplyRequest, ApplyResult, "engine", "op_apply", _ENGINE),
    Op("revert", RevertRequest, RevertResult, "engine", "op_revert", _ENGINE),
    Op("status", StatusRequest, StatusRecord, "engine", "op_status", _ENGINE),
    Op("capture", CaptureRequest, CaptureResult, "engine", "op_capture", _ENGINE),
    Op("bisect-mark", BisectMarkRequest, BisectMarkResult, "engine", "op_bisect_mark", _ENGINE),
    Op("facts", FactsRequest, FactsResult, "deployer", "op_facts", _DEPLOYER),
    Op("deploy", DeployRequest, DeployResult, "deployer", "op_deploy", _DEPLOYER,
       isolated=True),
    Op("audit", AuditRequest, AuditResult, "gather", "op_audit", _GATHERER),
    Op("inventory", InventoryRequest, InventoryResult, "adoption", "op_inventory", _ADOPTER),
    Op("adopt", AdoptRequest, AdoptResult, "adoption", "op_adopt", _ADOPTER),
)}
REQUESTS: Dict[str, Type[Request]] = {name: op.request for name, op in OPS.items()}
RESULTS: Dict[str, Type[Result]] = {name: op.result for name, op in OPS.items()}


def op_function(module: Any, request: Request) -> Any:
    """The function of `module` (a part of the host program) that serves `request`'s op,
    by the table; WireError (kind usage) when the op is not this part's."""
    op = OPS.get(request.op)
    if op is None or module.__name__.rpartition(".")[2] != op.part:
        raise WireError(f"{module.__name__.rpartition('.')[2]} does not serve the op "
                        f"{request.op!r}", "usage")
    return getattr(module, op.function)


def encode_request(request: Request) -> Dict[str, Any]:
    """The request as sent: its fields, its op and this protocol's version."""
    return {**request.to_json(), "op": request.op, "protocol": PROTOCOL}


def decode_request(data: Any) -> Request:
    """request.json -> its Request; WireError on another protocol, an unknown op, a field
    of the wrong type, a missing or an unknown field."""
    if not isinstance(data, dict):
        raise WireError(f"the request: expected a JSON object, got {_kind(data)}")
    body = dict(data)
    version, op = body.pop("protocol", None), body.pop("op", None)
    if version != PROTOCOL:
        raise WireError(f"the agent speaks protocol {PROTOCOL}, the request is protocol "
                        f"{version!r}: the controller and agent versions differ")
    if op not in REQUESTS:
        shown = repr(op) if isinstance(op, str) and len(op) <= 32 and op.replace(
            "-", "").isalpha() else "(not shown)"
        raise WireError(f"unknown op {shown}", "usage")
    return REQUESTS[op].from_json(body, f"the {op} request")


def encode_result(result: Union[Result, Failure]) -> Dict[str, Any]:
    if isinstance(result, Failure):
        return {"ok": False, "error": result.to_json()}
    return {"ok": True, **result.to_json()}


def decode_result(op: str, data: Any) -> Union[Result, Failure]:
    """The agent's result object -> the op's Result, or a Failure; WireError otherwise."""
    where = f"the {op} result"
    if not isinstance(data, dict) or type(data.get("ok")) is not bool:
        raise WireError(f"{where}: expected an object with a boolean 'ok'")
    body = dict(data)
    if not body.pop("ok"):
        if set(body) != {"error"}:
            raise WireError(f"{where}: a failure holds only 'error'")
        return Failure.from_json(body["error"], f"{where}.error")
    return RESULTS[op].from_json(body, where)
