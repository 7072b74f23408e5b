"""The project's JSON Schemas (2020-12), shared by the forwarder, central policy and consumers.

Each schema is a JSON file beside this module; `validator(name)` returns a ready validator with
the cross-file `$ref`s resolved, so callers never load files by path.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:  # imported where used: the forwarder's daemon imports `schemas.authn`, never jsonschema
    from jsonschema import Draft202012Validator
    from referencing import Registry

SCHEMA_FILES = (
    "imds-scheduled-events.schema.json",
    "envelope.schema.json",
    "approval.schema.json",
    "policy.schema.json",
)


def load(name: str) -> Dict[str, Any]:
    """The parsed schema file `name` (e.g. "envelope.schema.json")."""
    return json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


@cache
def _registry() -> Registry:
    from referencing import Registry, Resource

    registry: Registry = Registry()
    for name in SCHEMA_FILES:
        if not resources.files(__package__).joinpath(name).is_file():
            continue  # a schema a later issue adds
        schema = load(name)
        resource = Resource.from_contents(schema)
        registry = registry.with_resources([(schema["$id"], resource), (name, resource)])
    return registry


@cache
def validator(name: str) -> Draft202012Validator:
    """A validator for schema file `name`, with format checks (date-time) turned on."""
    from jsonschema import Draft202012Validator, FormatChecker

    return Draft202012Validator(load(name), registry=_registry(), format_checker=FormatChecker())


def errors(name: str, instance: Any, limit: int = 20) -> List[Dict[str, str]]:
    """Every reason `instance` fails schema `name`, as [{"path", "message"}], most specific first.

    An empty list means valid. Messages are cut to 300 characters so a hostile document cannot
    blow up what is logged or forwarded.
    """
    found = sorted(validator(name).iter_errors(instance), key=lambda e: (-len(e.path), str(e.path)))
    return [
        {"path": "/" + "/".join(str(p) for p in err.absolute_path), "message": err.message[:300]}
        for err in found[:limit]
    ]
