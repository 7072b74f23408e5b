"""App settings the way the Functions host sees them: a local.settings.json-style file.

Resolves `%NAME%` binding expressions and connection prefixes with the host's rules, so the runner
reads a binding exactly as Azure would and fails with a clear message where Azure would too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Optional

from sandbox.processes import AZURITE_ACCOUNT as _DEV_ACCOUNT
from sandbox.processes import AZURITE_KEY as _DEV_KEY

# Microsoft's well-known development-storage account (public, documented; not a secret). The host
# accepts `UseDevelopmentStorage=true`; azure-eventhub-checkpointstoreblob does not, so we expand it.
_EXPRESSION = re.compile(r"%([^%]+)%")


class SettingsError(ValueError):
    """A binding names a setting the settings file does not define (the host refuses to start too)."""


@dataclass(frozen=True)
class Connection:
    """A resolved connection: a connection string, or the `PREFIX__key` section of an identity-based one."""

    name: str
    connection_string: Optional[str] = None
    section: Dict[str, str] = field(default_factory=dict)

    @property
    def identity_based(self) -> bool:
        return self.connection_string is None


@dataclass
class AppSettings:
    """`Values` (app settings / environment) and the runner's `Keys` section of the settings file."""

    values: Dict[str, str]
    keys: Dict[str, object] = field(default_factory=dict)
    source: Optional[Path] = None

    @classmethod
    def load(cls, path: Path) -> AppSettings:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(
                f"settings file {path} does not exist (copy local.settings.example.json)"
            ) from None
        except json.JSONDecodeError as exc:
            raise SettingsError(f"settings file {path} is not JSON: {exc}") from None
        if document.get("IsEncrypted"):
            raise SettingsError(f"{path}: encrypted settings are not supported; set IsEncrypted to false")
        values = document.get("Values")
        if not isinstance(values, dict):
            raise SettingsError(f'{path}: needs a "Values" object of app settings')
        # The host hands every app setting to the worker as a string environment variable.
        return cls(
            values={str(k): "" if v is None else str(v) for k, v in values.items()},
            keys=dict(document.get("Keys") or {}),
            source=Path(path),
        )

    def get(self, name: str) -> Optional[str]:
        # App settings may use `:` or `__` as the section separator; Linux hosts only see `__`.
        return self.values.get(name, self.values.get(name.replace(":", "__")))

    def resolve(self, value: object) -> object:
        """Replace each `%NAME%` in a binding property with the app setting NAME."""
        if not isinstance(value, str):
            return value

        def lookup(match: re.Match) -> str:
            found = self.get(match.group(1))
            if found is None:
                raise SettingsError(
                    f"binding expression {match.group(0)} names app setting "
                    f"{match.group(1)!r}, which {self.source or 'the settings'} does not define"
                )
            return found

        return _EXPRESSION.sub(lookup, value)

    def connection(self, name: str) -> Connection:
        """The host's lookup for a binding's `connection`: `NAME`, then `AzureWebJobsNAME`, then `NAME__*`."""
        for candidate in (name, f"AzureWebJobs{name}"):
            value = self.get(candidate)
            if value:
                return Connection(name=name, connection_string=expand_development_storage(value))
        for candidate in (name, f"AzureWebJobs{name}"):
            prefix = candidate + "__"
            section = {k[len(prefix) :]: v for k, v in self.values.items() if k.startswith(prefix) and v}
            if section:
                return Connection(name=name, section=section)
        raise SettingsError(
            f"connection {name!r}: define app setting {name!r} (a connection string) or "
            f"{name}__fullyQualifiedNamespace / {name}__serviceUri / ... (identity-based)"
        )

    def as_environment(self) -> Mapping[str, str]:
        return dict(self.values)


def expand_development_storage(connection_string: str) -> str:
    """`UseDevelopmentStorage=true[;DevelopmentStorageProxyUri=http://host]` -> the full Azurite string."""
    parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
    if parts.get("UseDevelopmentStorage", "").lower() != "true":
        return connection_string
    base = parts.get("DevelopmentStorageProxyUri", "http://127.0.0.1").rstrip("/")
    return (
        f"DefaultEndpointsProtocol=http;AccountName={_DEV_ACCOUNT};AccountKey={_DEV_KEY};"
        f"BlobEndpoint={base}:10000/{_DEV_ACCOUNT};QueueEndpoint={base}:10001/{_DEV_ACCOUNT};"
        f"TableEndpoint={base}:10002/{_DEV_ACCOUNT};"
    )
