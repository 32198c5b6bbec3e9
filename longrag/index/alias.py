"""A build alias: one store location whose ``current.json`` names the build to serve.

Builds are immutable (``jobs.index`` refuses to write into one); an update (``jobs.update``) writes
a new build version beside the old one, under the alias root as ``builds/<build_id>/`` by default,
and then publishes it by rewriting the pointer. The pointer is one small object replaced in one
compare-and-swap (``Storage.swap_bytes``: under a lock, a temporary file renamed over the old one on a
local or shared disk; a PUT conditional on the ETag read on S3): a reader sees the old pointer or the
new one, never a mix, and of two updates racing from the same pointer exactly one publishes (the other
gets :class:`AliasConflict`). A Serve app started on the alias (``index: <alias root>``) resolves it to the build
(:func:`resolve_build`) and its Retrievers re-read it every ``index.refresh_s`` to switch builds
(``serve.deployments.Retriever``).

No Ray here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from longrag.index.manifest import utc_now

CURRENT_FILE = "current.json"
BUILDS_PREFIX = "builds"


class BuildPointer(BaseModel):
    """What ``current.json`` holds: the build served, where it is, and the previous one."""

    model_config = ConfigDict(extra="forbid")

    build_id: str
    uri: str = Field(description="the build's location: a path relative to the alias root, or an absolute URI")
    previous_build_id: str | None = None
    generation: int = Field(1, ge=1, description="1 for the first publication, +1 on every switch")
    published_at: str = Field(default_factory=utc_now)


class AliasError(ValueError):
    """A location that holds neither a build nor a pointer, or a pointer to an incomplete build."""


class AliasConflict(AliasError):
    """``publish(..., expect_build_id=)`` found the alias serving another build: an update raced this
    one and published first (or the alias moved since this update started). ``expected``: the build
    this update was made from; ``found``: the one the alias serves now (None: no pointer)."""

    def __init__(self, alias_uri: str, expected: str | None, found: str | None) -> None:
        super().__init__(f"{alias_uri} now serves {found or 'nothing'}, not {expected or 'nothing'}: another update "
                         "was published first; update from that build instead")
        self.alias_uri, self.expected, self.found = alias_uri, expected, found

    def __reduce__(self):
        return (type(self), (self.alias_uri, self.expected, self.found))


def _join(root: str, rel: str) -> str:
    if "://" in rel or rel.startswith("/"):
        return rel
    return f"{root.rstrip('/')}/{rel}"


def read_pointer(uri: str) -> BuildPointer | None:
    """The pointer at ``uri`` (an alias root), or None when there is none."""
    from longrag.store import open_storage

    storage = open_storage(uri)
    try:
        data = storage.read_bytes(CURRENT_FILE)
    except FileNotFoundError:
        return None
    return BuildPointer.model_validate_json(data)


def resolve_build(uri: str) -> tuple[str, BuildPointer | None]:
    """``(build URI, pointer)``: a build location is itself (no pointer); an alias root is the build
    its pointer names. Raises :class:`AliasError` when ``uri`` holds neither."""
    from longrag.index.artifacts import ArtifactStore

    store = ArtifactStore.open(uri)
    if store.has_manifest():
        return store.uri, None
    pointer = read_pointer(uri)
    if pointer is None:
        raise AliasError(f"{uri} holds neither a build (manifest.json) nor a build alias ({CURRENT_FILE})")
    return _join(store.uri, pointer.uri), pointer


def publish(alias_uri: str, build_uri: str, *, expect_build_id: str | None = None) -> BuildPointer:
    """Point the alias at the complete build at ``build_uri`` (stored relative to the alias root
    when it lies under it), in one compare-and-swap of the pointer (``Storage.swap_bytes``).
    ``expect_build_id``: publish only if the alias still names that build when the pointer is
    swapped, else :class:`AliasConflict` naming it and the build found (two updates racing from the
    same parent: exactly one publishes). Without it, the new pointer replaces whatever is there,
    counting its generation from the pointer it replaces (a racing publish is read again)."""
    from longrag.index.artifacts import ArtifactStore
    from longrag.store import WriteConflict, open_storage

    target = ArtifactStore.open(build_uri)
    if target.status() != "complete":
        raise AliasError(f"refusing to publish {build_uri}: its build is {target.status()!r}, not complete")
    manifest = target.read_manifest()
    storage = open_storage(alias_uri)
    if storage.exists("manifest.json"):
        raise AliasError(f"{alias_uri} is a build, not an alias root: publish to a separate location")
    root = storage.uri.rstrip("/") + "/"
    rel = target.uri[len(root):] if target.uri.startswith(root) else target.uri
    try:
        raw: bytes | None = storage.read_bytes(CURRENT_FILE)
    except FileNotFoundError:
        raw = None
    for _ in range(100):  # without an expectation: read again while other publishes land first
        old = BuildPointer.model_validate_json(raw) if raw is not None else None
        if expect_build_id is not None and (old.build_id if old else None) != expect_build_id:
            raise AliasConflict(alias_uri, expect_build_id, old.build_id if old else None)
        pointer = BuildPointer(build_id=manifest.build_id, uri=rel, previous_build_id=old.build_id if old else None,
                               generation=(old.generation + 1) if old else 1)
        try:
            storage.swap_bytes(CURRENT_FILE, pointer.model_dump_json(indent=2).encode(), expected=raw)
            return pointer
        except WriteConflict as exc:
            raw = exc.found
    raise AliasError(f"{alias_uri}: 100 publishes landed while this one tried; try again")


def build_location(alias_uri: str, build_id: str) -> str:
    """Where an update publishing to ``alias_uri`` writes its build by default."""
    from longrag.store import open_storage

    return _join(open_storage(alias_uri).uri, f"{BUILDS_PREFIX}/{build_id}")
