"""Every setting in ONE table: flag, env var, config-file key, default, meaning.

Precedence: command-line flag > environment variable > JSON config file > default. Adding a
setting is one `Setting(...)` line below; the CLI, the env/file loading and the docs tables (README,
docs/forwarder.md) all come from it. Checks that involve several settings live in `config_rules.py`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


class ConfigError(ValueError):
    """A setting has a bad value or the config file is unreadable; the message names which."""


def _positive_float(text: Any) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):  # float() reads "nan" and "inf": a busy loop, an overflow
        raise ValueError("must be a number > 0")
    return value


def _non_negative_float(text: Any) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("must be a number >= 0")
    return value


def _positive_int(text: Any) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _str(text: Any) -> str:
    return str(text)


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _names(text: Any) -> Tuple[str, ...]:
    """A comma-separated list (or a JSON list in the config file); empty = none."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return tuple(str(i).strip() for i in items if str(i).strip())


def _port(text: Any) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a TCP port 0..65535 (0: off)")
    return value


RUN = ("run", "check")               # the daemon's settings: `run` and `check` take them all
APPROVE = ("run", "check", "approve")  # also what `se-forwarder approve` needs


@dataclass(frozen=True)
class Setting:
    key: str                       # attribute and config-file key (snake_case)
    default: Any
    help: str
    parse: Callable[[Any], Any] = _str
    choices: Optional[Tuple[str, ...]] = None
    secret: bool = False           # never printed
    commands: Tuple[str, ...] = RUN  # the subcommands that take this setting as a flag

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def is_switch(self) -> bool:
        return self.parse is _bool

    @property
    def default_text(self) -> str:
        """The default as a person writes it: `false`, `Preempt,Terminate`, `60`, '' for none."""
        return value_text(self.default)

    @property
    def env(self) -> str:
        return "SE_FORWARDER_" + self.key.upper()


def value_text(value: Any) -> str:
    """A setting's value as a person writes it on the command line (never a Python repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


DEFAULT_CONFIG = "/etc/se-forwarder/config.json"

SETTINGS: Tuple[Setting, ...] = (
    Setting("config", DEFAULT_CONFIG, "JSON config file (keys = the config keys below); "
            "missing is fine unless given explicitly", commands=APPROVE),
    Setting("imds_url", "http://169.254.169.254", "IMDS base URL, http://host[:port][/path] "
            "(sandbox: http://127.0.0.1:N/vms/<name>)", commands=APPROVE),
    Setting("api_version", "2020-07-01", "scheduled-events api-version, one IMDS documents: "
            "2017-03-01, 2017-08-01, 2017-11-01, 2019-01-01, 2019-04-01, 2019-08-01, 2020-07-01",
            commands=APPROVE),
    Setting("state_dir", "/var/lib/se-forwarder", "directory of the durable outbox (SQLite) and state",
            commands=APPROVE),
    Setting("poll_interval", 1.0, "seconds between IMDS polls (IMDS recommends 1; at least 0.25: IMDS "
            "allows 5 requests/s per VM, shared with token and approval calls)", _positive_float),
    Setting("heartbeat_interval", 60.0, "seconds between heartbeat envelopes", _positive_float),
    Setting("sink", "file", "where envelopes go: eventhub, file or stdout (default: eventhub when "
            "eventhub_namespace or eventhub_connection_string is set, else file)",
            choices=("eventhub", "file", "stdout")),
    Setting("sink_file", "", "JSON-lines file for --sink file (default <state-dir>/published.jsonl)"),
    Setting("eventhub_namespace", "", "Event Hubs fully qualified namespace (<ns>.servicebus.windows.net)"),
    Setting("eventhub_name", "", "Event Hub name"),
    Setting("eventhub_idle_close", 20.0, "seconds without a send after which the Event Hubs connection is "
            "closed (the next send opens one): at a 60 s heartbeat a VM holds a connection about a third of "
            "the time, so a Standard namespace's 5,000 connections serve ~14,000 VMs (docs/sizing.md); "
            "0 keeps it open", _non_negative_float),
    Setting("eventhub_connection_string", "", "Event Hubs connection string: emulator/sandbox ONLY "
            "(production uses managed identity)", secret=True),
    Setting("client_id", "", "client id of a user-assigned managed identity (empty: system-assigned)"),
    Setting("authenticate", False, "sign each envelope with a key of this boot bound to the VM by IMDS's "
            "attested document (default: on with the Event Hubs sink, which central's default "
            "AUTHN_MODE=required needs; docs/security.md)", _bool),
    Setting("attestation_attach_every", 0.0, "seconds between events carrying the attested document "
            "besides each send's first (0: every event; more needs central's key store)",
            _non_negative_float),
    Setting("outbox_max_rows", 10000, "most envelopes kept pending; when full the oldest heartbeats, "
            "then the oldest others are dropped and counted", _positive_int, commands=APPROVE),
    Setting("log_level", "info", "debug, info, warning or error",
            choices=("debug", "info", "warning", "error"), commands=APPROVE),
    Setting("metrics_port", 0, "serve Prometheus text metrics on http://127.0.0.1:<port>/metrics "
            "(loopback only; 0: off)", _port),
    # approvals, hooks, fast path (docs/approvals.md)
    Setting("queue_service_uri", "", "approval queues: https://<account>.queue.core.windows.net "
            "(managed identity); empty with no connection string: no central approvals"),
    Setting("queue_client_id", "", "client id of the user-assigned identity that reads the approval "
            "queue (empty: the VM's system-assigned identity, which the infra install scopes to this "
            "VM's own queue)"),
    Setting("queue_connection_string", "", "approval queues via a connection string: Azurite/sandbox "
            "ONLY", secret=True),
    Setting("approval_fast_interval", 2.0, "seconds between approval-queue reads while IMDS lists a "
            "Scheduled event for this VM (the queue is not read otherwise)", _positive_float),
    Setting("approval_slow_interval", 60.0, "longest back-off, in seconds, between approval-queue reads "
            "after queue errors", _positive_float),
    Setting("approval_visibility_timeout", 360, "seconds a received approval stays invisible; must "
            "exceed hook_timeout + 30 (a POST); after a crash it reappears then", _positive_int),
    Setting("approval_max_dequeue", 5, "an approval message received more often than this is poison: "
            "reported and set aside", _positive_int),
    Setting("approval_poison_queue", False, "try moving poison messages to <queue>-poison (needs send "
            "rights VMs normally lack); else they are deleted after the report", _bool),
    Setting("hook_dir", "/etc/se-forwarder/hooks", "hook directory: pre-approve.d/ and post-event.d/ "
            "(files ending .example are not run)", commands=APPROVE),
    Setting("hook_timeout", 300.0, "seconds a hook may run before its process group is killed",
            _positive_float, commands=APPROVE),
    Setting("require_pre_approve_hook", False, "strict: an approval that asks for the pre-approve hook "
            "fails (hook-failed) when none is installed; off: it is approved, the result says no hook "
            "was installed", _bool, commands=APPROVE),
    Setting("local_event_types", ("Preempt", "Terminate"), "event types the local fast path handles at "
            "once, comma-separated, from Freeze, Reboot, Redeploy, Preempt, Terminate (empty: none)", _names),
    Setting("local_approve", False, "fast path: approve those events locally after the pre-approve hook "
            "(without waiting for central)", _bool),
)
BY_KEY: Dict[str, Setting] = {s.key: s for s in SETTINGS}


class Config:
    """Resolved settings: `config.poll_interval`; `config.source("sink")` says where a value came from."""

    def __init__(self, values: Dict[str, Any], sources: Dict[str, str]) -> None:
        self._values = values
        self._sources = sources

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def source(self, key: str) -> str:
        return self._sources[key]

    def as_dict(self, redact: bool = True) -> Dict[str, Any]:
        return {k: ("***" if redact and BY_KEY[k].secret and v else v) for k, v in self._values.items()}

    @property
    def sink_path(self) -> Path:
        return Path(self.sink_file) if self.sink_file else Path(self.state_dir) / "published.jsonl"


def _coerce(setting: Setting, raw: Any, origin: str) -> Any:
    try:
        value = setting.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{setting.key} from {origin}: {raw!r} is not valid ({exc})") from exc
    if setting.choices and value not in setting.choices:
        choices = ", ".join(setting.choices)
        raise ConfigError(f"{setting.key} from {origin}: {value!r} is not one of {choices}")
    return value


def read_file(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object of settings")
    unknown = sorted(set(data) - set(BY_KEY) - {"config"})
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(BY_KEY))}")
    return data


def load(flags: Mapping[str, Any], env: Optional[Mapping[str, str]] = None) -> Config:
    """Resolve every setting. `flags`: only the flags actually given (key -> value)."""
    env = os.environ if env is None else env
    config_setting = BY_KEY["config"]
    if "config" in flags:
        config_path, explicit = Path(flags["config"]), True
    elif config_setting.env in env:
        config_path, explicit = Path(env[config_setting.env]), True
    else:
        config_path, explicit = Path(DEFAULT_CONFIG), False
    file_values: Dict[str, Any] = {}
    if config_path.exists() or explicit:
        file_values = read_file(config_path)
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for setting in SETTINGS:
        if setting.key in flags and flags[setting.key] is not None:
            values[setting.key] = _coerce(setting, flags[setting.key], f"flag {setting.flag}")
            sources[setting.key] = "flag"
        elif setting.env in env:
            values[setting.key] = _coerce(setting, env[setting.env], f"env {setting.env}")
            sources[setting.key] = "env"
        elif setting.key in file_values:
            values[setting.key] = _coerce(setting, file_values[setting.key], f"config file {config_path}")
            sources[setting.key] = "file"
        else:
            values[setting.key] = setting.default
            sources[setting.key] = "default"
    values["config"] = str(config_path)
    eventhub_given = values["eventhub_namespace"] or values["eventhub_connection_string"]
    if sources["sink"] == "default" and eventhub_given:
        values["sink"] = "eventhub"  # Event Hubs settings given and no sink chosen: publish there
    if sources["authenticate"] == "default":
        values["authenticate"] = values["sink"] == "eventhub"  # secure by default where central listens
    return Config(values, sources)


BEGIN, END = "<!-- forwarder-settings:begin -->", "<!-- forwarder-settings:end -->"


def markdown_table() -> str:
    """docs/forwarder.md's settings table, generated from SETTINGS (tests keep the page current:
    `python -m forwarder.config --write docs/forwarder.md` rewrites the block between the markers)."""
    lines = ["| flag | env | config key | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        flag = f"`{s.flag}` / `--no-{s.flag[2:]}`" if s.is_switch else f"`{s.flag}`"
        default = f"`{s.default_text}`" if s.default_text else ""
        meaning = s.help.replace("|", "\\|")  # a literal pipe would split the Markdown cell
        lines.append(f"| {flag} | `{s.env}` | `{s.key}` | {default} | {meaning} |")
    return "\n".join(lines)


def markdown_block() -> str:
    return f"{BEGIN}\n{markdown_table()}\n{END}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        page = Path(sys.argv[2])
        text = page.read_text(encoding="utf-8")
        head, tail = text.index(BEGIN), text.index(END) + len(END)
        page.write_text(text[:head] + markdown_block() + text[tail:], encoding="utf-8")
    else:
        print(markdown_table())
