"""Configuration errors end `run` and `check` with one actionable line and exit 2, before any work; the
CLI reads like a Unix tool (switches, help per subcommand, human values); the docs' tables are the code's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from forwarder import cli
from forwarder import config as cfg
from forwarder import config_rules as validate
from sandbox import processes

REPO = processes.REPO


def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str, command: str = "run") -> tuple:
    """`se-forwarder <command> ...` in process, with an explicit empty config file and a fresh state dir."""
    config = tmp_path / "config.json"
    if not config.exists():
        config.write_text("{}")
    state = tmp_path / "state"
    code = cli.main([command, "--config", str(config), "--state-dir", str(state), *argv])
    out, err = capsys.readouterr()
    return code, out, err, state


# Each case: the flags, a piece of the one line that must name the setting and say what to do.
BAD = [
    (["--imds-url", "169.254.169.254"], "imds_url '169.254.169.254' has no scheme: use http://169.254.169.254"),
    (["--imds-url", "ftp://169.254.169.254"], "the scheme must be http://"),
    (["--imds-url", "https://169.254.169.254"], "the scheme must be http://"),
    (["--imds-url", "http://"], "has no host"),
    (["--imds-url", "http://169.254.169.254:99999"], "is not a valid URL"),
    (["--imds-url", "http://169.254.169.254/?x=1"], "must not carry a query"),
    (["--api-version", "2015-01-01"], "use one of 2017-03-01"),
    (["--api-version", "latest"], "is not a scheduled-events api-version"),
    (["--poll-interval", "0.05"], "20 requests/s, past IMDS's budget of 5 per second"),
    (["--poll-interval", "-1"], "poll_interval from flag --poll-interval: '-1' is not valid (must be a"),
    (["--poll-interval", "nan"], "flag --poll-interval: 'nan' is not valid (must be a number > 0)"),
    (["--heartbeat-interval", "inf"], "heartbeat_interval from flag --heartbeat-interval: 'inf' is not"),
    (["--hook-timeout", "inf"], "hook_timeout from flag --hook-timeout: 'inf' is not valid"),
    (["--queue-connection-string", "UseDevelopmentStorage=true", "--approval-visibility-timeout", "700000"],
     "approval_visibility_timeout 700000 s is longer than Azure Queue storage allows (604800 s, 7 days)"),
    (["--local-event-types", "Reboot,Bogus"], "local_event_types: Bogus is not an IMDS event type"),
    (["--queue-connection-string", "UseDevelopmentStorage=true", "--approval-visibility-timeout", "10"],
     "approval_visibility_timeout 10 s must exceed hook_timeout (300 s) + 30 s"),
    (["--queue-service-uri", "http://acct.queue.core.windows.net"], "the scheme must be https://"),
    (["--queue-service-uri", "https://a.queue.core.windows.net", "--queue-connection-string", "x"],
     "set either queue_service_uri"),
    (["--eventhub-name", "hub"], "eventhub_name 'hub' is set but neither eventhub_namespace"),
    (["--sink", "eventhub"], "the eventhub sink needs eventhub_namespace"),
    (["--eventhub-namespace", "ns.servicebus.windows.net"], "eventhub_name is empty"),
    (["--eventhub-namespace", "sb://ns.servicebus.windows.net", "--eventhub-name", "h"],
     "must be a host name"),
    (["--eventhub-namespace", "ns.servicebus.windows.net", "--eventhub-name", "h",
      "--eventhub-connection-string", "Endpoint=sb://x/"], "not both"),
    (["--authenticate"], "authenticate signs envelopes on the Event Hubs sink"),
    (["--client-id", "my-identity"], "client_id 'my-identity' is not a GUID"),
    (["--metrics-port", "70000"], "metrics_port from flag --metrics-port: '70000' is not valid"),
    (["--sink", "kafka"], None),  # argparse's own choice error (exit 2 as well)
]


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a)[:50] for a, _ in BAD])
def test_every_configuration_error_is_one_line_and_exit_2_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, argv: List[str],
        message: Optional[str]) -> None:
    if message is None:
        with pytest.raises(SystemExit) as info:
            run_cli(tmp_path, capsys, *argv, command=command)
        assert info.value.code == 2
        return
    code, out, err, state = run_cli(tmp_path, capsys, *argv, command=command)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("se-forwarder: configuration error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err
    assert not state.exists(), "no work before the configuration is known good"


def test_config_file_errors_are_one_line_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"imds_url": "169.254.169.254"}))
    code, _, err, _ = run_cli(tmp_path, capsys)
    assert code == 2 and "imds_url '169.254.169.254' has no scheme" in err
    (tmp_path / "config.json").write_text("{not json")
    code, _, err, _ = run_cli(tmp_path, capsys)
    assert code == 2 and "cannot read config file" in err and len(err.strip().splitlines()) == 1


def test_run_as_a_process_prints_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "forwarder", "run", "--config", str(tmp_path / "c.json"),
                           "--imds-url", "169.254.169.254"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_good_configurations_have_no_problems() -> None:
    for flags in ({}, {"poll_interval": "0.25"}, {"imds_url": "http://127.0.0.1:8169/vms/vm0"},
                  {"eventhub_namespace": "ns.servicebus.windows.net", "eventhub_name": "h",
                   "queue_service_uri": "https://acct.queue.core.windows.net", "authenticate": "true",
                   "client_id": "11111111-2222-3333-4444-555555555555"},
                  {"eventhub_connection_string": "Endpoint=sb://127.0.0.1:5672;EntityPath=h",
                   "queue_connection_string": "UseDevelopmentStorage=true", "hook_timeout": "20",
                   "approval_visibility_timeout": "60", "local_event_types": ""}):
        assert validate.problems(cfg.load(flags, {})) == [], flags


def test_known_api_versions_and_event_types_are_the_schemas() -> None:
    schema = json.loads((REPO / "schemas" / "imds-scheduled-events.schema.json").read_text())
    assert tuple(schema["$defs"]["event"]["properties"]["EventType"]["enum"]) == validate.EVENT_TYPES
    first, last = re.search(r"api-version (\S+) \.\. (\S+)\)", schema["title"]).groups()
    assert (validate.API_VERSIONS[0], validate.API_VERSIONS[-1]) == (first, last)
    reference = Path("/work/shared/reference/imds-scheduled-events.md")
    if reference.exists():
        for version in validate.API_VERSIONS:
            assert version in reference.read_text()


# ---- the CLI ------------------------------------------------------------------------------------

def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_booleans_are_switches(tmp_path: Path) -> None:
    parser = cli._parser()
    on = cli._given(parser.parse_args(["run", "--local-approve"]))
    off = cli._given(parser.parse_args(["run", "--no-local-approve"]))
    scripted = cli._given(parser.parse_args(["run", "--local-approve", "false"]))  # older scripts
    empty = tmp_path / "c.json"
    empty.write_text("{}")
    assert cfg.load({**on, "config": str(empty)}, {}).local_approve is True
    env_on = {"SE_FORWARDER_LOCAL_APPROVE": "true"}
    assert cfg.load({**off, "config": str(empty)}, env_on).local_approve is False  # the flag wins
    assert cfg.load({**scripted, "config": str(empty)}, {}).local_approve is False


def test_help_per_subcommand_with_human_values(capsys: pytest.CaptureFixture[str]) -> None:
    run = " ".join(_help(capsys, "run").split())
    assert "--local-approve, --no-local-approve" in run and "default Preempt,Terminate" in run
    assert "('Preempt'" not in run and "default False" not in run and "default false" in run
    approve = _help(capsys, "approve")
    flags = set(re.findall(r"(--[a-z][a-z-]+)", approve))
    assert {"--hook", "--imds-url", "--state-dir", "--hook-dir", "--require-pre-approve-hook"} <= flags
    daemon_only = {"--sink", "--eventhub-name", "--poll-interval", "--queue-service-uri", "--local-approve"}
    assert not flags & daemon_only
    check = " ".join(_help(capsys, "check").split())
    assert "--json" in check and "--sink" in check


def test_settings_tables_in_readme_and_forwarder_doc_are_generated_from_the_code() -> None:
    from tools.settings_table import block

    readme = (REPO / "README.md").read_text()
    assert block() in readme, "README.md settings table is stale: run python -m tools.settings_table --write"
    page = (REPO / "docs" / "forwarder.md").read_text()
    assert cfg.markdown_block() in page, \
        "docs/forwarder.md settings table is stale: run python -m forwarder.config --write docs/forwarder.md"
    assert "`Preempt,Terminate`" in block() and "`False`" not in block()
    assert "('Preempt', 'Terminate')" not in readme and "('Preempt', 'Terminate')" not in page


def test_forwarder_doc_names_every_module_and_every_exit_code() -> None:
    from forwarder import exitcodes

    page = (REPO / "docs" / "forwarder.md").read_text()
    modules = sorted(p.relative_to(REPO / "forwarder").as_posix() for p in (REPO / "forwarder").rglob("*.py")
                     if p.name != "__init__.py" and p.name != "__main__.py")
    missing = [m for m in modules if f"`{m}`" not in page and f"`{Path(m).parent}/`" not in page]
    assert not missing, f"docs/forwarder.md's module table lacks {missing}"
    table = page.split("## Exit codes", 1)[1]
    for name, value in vars(exitcodes).items():
        if name.isupper():
            documented = re.search(rf"^\| {value} \|", table, re.MULTILINE)
            assert documented, f"exit code {value} ({name}) undocumented"
    assert "issue 3" not in page and "sandbox/demo.py" not in page


def test_approvals_doc_settings_rows_match_the_code() -> None:
    page = (REPO / "docs" / "approvals.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    assert len(rows) >= 12
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        flag = cells[0].split("`")[1]
        setting = next((s for s in cfg.SETTINGS if s.flag == flag), None)
        assert setting is not None, f"docs/approvals.md names an unknown flag {flag}"
        assert cells[1] == f"`{setting.env}`" and cells[2] == f"`{setting.key}`", row
        assert cells[3].strip("`") == setting.default_text, (flag, cells[3], setting.default_text)
        assert ("--no-" in cells[0]) == setting.is_switch, row
