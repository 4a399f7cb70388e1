"""What the GCE metadata server answers for a path: the tree of one VM's values, directory listings
(plain or recursive, in camelCase), ETags, and the HTTP answer with its malformed variant.

Separate from api.py, which decides when to answer (header checks, long-polls, identity tokens).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from simulator.gce_api.project import PROJECT_ID, PROJECT_NUMBER, ZONE, instance_id
from simulator.gce_api.values import VmMetadata
from simulator.store import Response


def etag_of(path: str, text: str | None) -> str:
    """16 lowercase hex digits over the key and its value; an absent key has an ETag of its own."""
    material = f"{path}\n{text}" if text is not None else f"{path}\n<absent>"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Served:
    """One path's current answer: `text` None means 404; `is_json` picks the content type."""

    etag: str
    text: str | None
    is_json: bool = False


def serve(tree: dict[str, object], path: str, recursive: bool) -> Served | None:
    """The answer for `path` (a directory when it ends in "/"), or None when no such path exists."""
    node: object = tree
    for part in (p for p in path.split("/") if p):
        if not isinstance(node, dict) or not _is_directory(node) or part not in node:
            return None
        node = node[part]
    if path == "" or path.endswith("/"):
        if not isinstance(node, dict) or not _is_directory(node):
            return None
        if recursive:
            text = json.dumps(_camel_tree(node))
            return Served(etag=etag_of(path, text), text=text, is_json=True)
        listing = "".join(
            f"{name}/\n" if _is_directory(child) else f"{name}\n"
            for name, child in sorted(node.items())
            if child is not None
        )
        return Served(etag=etag_of(path, listing), text=listing)
    if _is_directory(node):
        return None
    if node is None:
        return Served(etag=etag_of(path, None), text=None)
    if isinstance(node, dict):
        text = json.dumps(node)
        return Served(etag=etag_of(path, text), text=text, is_json=True)
    return Served(etag=etag_of(path, str(node)), text=str(node))


def metadata_tree(vm: str, meta: VmMetadata) -> dict[str, object]:
    instance: dict[str, object] = {
        "hostname": f"{vm}.{ZONE}.c.{PROJECT_ID}.internal",
        "id": instance_id(vm),
        "maintenance-event": meta.maintenance_event.value,
        "name": vm,
        "preempted": "TRUE" if meta.preempted else "FALSE",
        "upcoming-maintenance": None if meta.upcoming is None else dict(meta.upcoming),
        "zone": f"projects/{PROJECT_NUMBER}/zones/{ZONE}",
    }
    project: dict[str, object] = {"numeric-project-id": PROJECT_NUMBER, "project-id": PROJECT_ID}
    return {"instance": instance, "project": project}


def _is_directory(node: object) -> bool:
    # upcoming-maintenance is the one JSON-valued key; every other dict is a directory.
    return isinstance(node, dict) and "maintenanceStatus" not in node


def _camel_tree(node: dict[str, object]) -> dict[str, object]:
    """A recursive directory answer: GCE names keys in camelCase there (maintenanceEvent)."""
    result: dict[str, object] = {}
    for name, child in sorted(node.items()):
        if child is None:
            continue
        head, *rest = name.split("-")
        key = head + "".join(word.capitalize() for word in rest)
        result[key] = _camel_tree(child) if isinstance(child, dict) and _is_directory(child) else child
    return result


def text_answer(status: int, text: str, etag: str | None = None) -> Response:
    headers: tuple[tuple[str, str], ...] = (("Metadata-Flavor", "Google"),)
    if etag is not None:
        headers += (("ETag", etag),)
    return Response(status=status, body=text.encode(), content_type="text/html; charset=utf-8", headers=headers)


def render(served: Served, alt: str) -> Response:
    headers = (("Metadata-Flavor", "Google"), ("ETag", served.etag))
    if served.text is None:
        return Response(status=404, body=b"Not Found\n", content_type="text/html; charset=utf-8", headers=headers)
    if served.is_json:
        return Response(
            status=200,
            body=served.text.encode(),
            content_type="application/json",
            headers=headers,
            broken=_pseudo_json(served.text),
        )
    if alt == "json":
        body = json.dumps(served.text).encode()
        return Response(status=200, body=body, content_type="application/json", headers=headers, broken=b'"NO')
    return Response(
        status=200,
        body=served.text.encode(),
        content_type="application/text",
        headers=headers,
        broken=b"\x00\xff<garbage>\x13",
    )


def _pseudo_json(text: str) -> bytes:
    """The comma-less pseudo-JSON the GCE docs print for upcoming-maintenance: what a sloppy server sends."""
    value = json.loads(text)
    if not isinstance(value, dict):
        return text[: len(text) // 2].encode()
    lines = [f'   "{key}":"{item}"' for key, item in value.items()]
    return ("{\n" + "\n".join(lines) + "\n}\n").encode()
