"""se-policy says exactly what is wrong (issue 26): a misspelt key gives no follow-on errors from the branch
it selected; a window with start and end swapped gets its own hint with the hours each reading opens;
explain shows a window's times in its own zone beside UTC; whatif --since reads the deployed tables by
default, or says in one line how to name them; a closed pipe ends every console script quietly."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from central.cli import se_policy as policy_cli
from central.cli.whatif_command import DEFAULT_TABLE_PREFIX
from central.policy import document as policy_mod
from central.policy.lint import lint
from central.policy.validation import document_errors

from .conftest import Env

REPO = Path(__file__).resolve().parents[2]


def _messages(doc: dict) -> List[str]:
    return [f"{f.path}: {f.message} | {f.hint}" for f in document_errors(doc)]


def test_a_misspelt_action_says_only_what_is_wrong() -> None:
    found = _messages({"version": 1, "rules": [{"name": "db", "acton": "hold"}]})
    assert not any("approve-in-window needs" in m for m in found), found
    assert any("'acton' was unexpected" in m and "did you mean 'action'?" in m for m in found), found
    assert any("'action' is a required property" in m for m in found), found
    assert len(found) == 2, found


def test_a_misspelt_group_by_says_only_what_is_wrong() -> None:
    found = _messages({"version": 1, "budgets": {"b": {"groupby": "zone", "maxImpacted": 1}}})
    assert not any('needs "tag"' in m for m in found), found
    assert any("did you mean 'groupBy'?" in m for m in found) and len(found) == 2, found


def test_approve_in_window_without_a_window_still_says_so() -> None:
    found = _messages({"version": 1, "rules": [{"name": "r", "action": "approve-in-window"}]})
    assert found == ['/rules/0: \'window\' is a required property | approve-in-window needs "window": '
                     'the name of one in /windows']


def _window_findings(start: str, end: str) -> List[str]:
    doc = {"version": 1, "windows": {"night": {"timeZone": "Europe/Berlin", "start": start, "end": end}},
           "rules": [{"name": "r", "action": "approve-in-window", "window": "night"}]}
    return [f"{f.code}: {f.message} | {f.hint}" for f in lint(policy_mod.load(json.dumps(doc)))]


def test_a_swapped_window_gets_its_own_hint_with_the_hours() -> None:
    swapped = [f for f in _window_findings("06:00", "02:00") if f.startswith("window-swapped")]
    assert swapped == ["window-swapped: start 06:00 is after end 02:00: read as an overnight window, open "
                       "20 h a day (06:00 to 02:00 the next day, Europe/Berlin) | if you meant 02:00-06:00 "
                       "(4 h a day), swap start and end"]
    # a real overnight window (6 h) is not suspected
    assert not [f for f in _window_findings("22:00", "04:00") if f.startswith("window-swapped")]


def test_the_cli_prints_the_swapped_window_hint(tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({"version": 1, "windows": {"w": {"start": "07:00", "end": "01:00"}},
                                  "rules": [{"name": "r", "action": "approve-in-window", "window": "w"}]}))
    out = io.StringIO()
    assert policy_cli.main(["check", str(policy)], out=out) == 0
    assert "open 18 h a day" in out.getvalue() and "if you meant 01:00-07:00 (6 h a day)" in out.getvalue()


def test_explain_shows_a_berlin_window_in_berlin_time_and_utc(tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({
        "version": 1, "windows": {"night": {"timeZone": "Europe/Berlin", "start": "02:00", "end": "04:00"}},
        "rules": [{"name": "r", "match": {"eventTypes": ["Redeploy"]}, "action": "approve-in-window",
                   "window": "night"}]}))
    argv = ["explain", str(policy), "--event", json.dumps({"EventId": "E1", "EventType": "Redeploy",
                                                           "NotBefore": "2026-11-22T00:00:00Z"}),
            "--now", "2026-11-20T12:00:00Z"]
    out = io.StringIO()
    assert policy_cli.main(argv, out=out) == 0
    text = out.getvalue()
    # 02:00 Berlin (CET, UTC+1) on Saturday is 01:00 UTC
    assert "window night: 02:00-04:00 Europe/Berlin; next opens 2026-11-21T01:00:00.000Z = Sat 02:00 " \
           "Europe/Berlin" in text, text
    assert "(next opens 2026-11-21T01:00:00.000Z (Sat 02:00 Europe/Berlin))" in text, text
    out = io.StringIO()
    assert policy_cli.main([*argv, "--json"], out=out) == 0
    window = json.loads(out.getvalue())["window"]
    assert window["nextOpenLocal"] == "Sat 02:00 Europe/Berlin" and window["timeZone"] == "Europe/Berlin"


def test_whatif_defaults_to_the_deployed_table_prefix() -> None:
    bicep = (REPO / "infra" / "main.bicep").read_text()
    assert re.search(r"param tablePrefix string = '(\w+)'", bicep).group(1) == DEFAULT_TABLE_PREFIX
    args = policy_cli.parser().parse_args(["whatif", "p.json", "--since", "7d"])
    assert args.table_prefix == DEFAULT_TABLE_PREFIX


def test_whatif_says_in_one_line_how_to_name_the_tables(env: Env, tmp_path: Path) -> None:
    policy = tmp_path / "p.json"
    policy.write_text('{"version": 1}')
    out = io.StringIO()
    # this Azurite has the test's own prefix only: the default finds nothing, and says how to fix it
    code = policy_cli.main(["whatif", str(policy), "--since", "7d", "--connection-string", env.conn], out=out)
    assert code == 4
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1 and f"no table {DEFAULT_TABLE_PREFIX}State" in lines[0], lines
    assert "--table-prefix" in lines[0] and "TABLE_PREFIX" in lines[0]


# ---- a closed pipe, in every console script ---------------------------------------------------------------

SCRIPTS = {
    "se-policy": "from central.cli.se_policy import main",
    "se-fleet": "from central.cli.se_fleet import main",
    "se-forwarder": "from forwarder.cli import main",
}


def _into_closed_pipe(script: str, args: List[str], env: Optional[Dict[str, str]] = None
                      ) -> subprocess.CompletedProcess:
    """The console script's entry (as pip writes it), stdout a pipe whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        entry = f"import sys; {SCRIPTS[script]}; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", entry, *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60, cwd=REPO, env={**os.environ, **(env or {})})
    finally:
        os.close(write)


def _quiet(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 141, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["check", "--json", "infra/policy.json"],
                                  ["whatif", "infra/policy.json", "--from", "/dev/null", "--json"]])
def test_se_policy_into_a_closed_pipe_is_no_traceback(args: List[str]) -> None:
    _quiet(_into_closed_pipe("se-policy", args))


def test_se_forwarder_into_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    # check --json prints its findings whatever they are: IMDS is a closed port here (fails in ~2 s)
    config = tmp_path / "config.json"
    config.write_text("{}")
    args = ["check", "--json", "--config", str(config), "--imds-url", "http://127.0.0.1:9", "--sink", "file",
            "--sink-file", str(tmp_path / "out.jsonl")]
    _quiet(_into_closed_pipe("se-forwarder", args, {"SE_FORWARDER_STATE_DIR": str(tmp_path / "state")}))


FLEET = {"at": "2026-11-20T12:00:00.000Z", "livenessSeconds": 300, "knownVms": 1, "liveVms": 1,
         "silentVms": 0, "vms": [{"vmId": "v1", "name": "vm-a", "groups": [], "lastSeen": None,
                                  "outboxBacklog": 0, "outboxDropped": 0, "forwarderVersion": "0.1.0",
                                  "openEvents": [], "silent": False}]}


class _Central(BaseHTTPRequestHandler):
    """GET /api/fleet's documented answer (docs/openapi.yaml): se-fleet's output is what is under test."""

    def do_GET(self) -> None:
        body = json.dumps(FLEET).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_se_fleet_into_a_closed_pipe_is_no_traceback() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Central)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        _quiet(_into_closed_pipe("se-fleet", ["status", "--url", url, "--token", "t", "--json"],
                                 {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_findings_under_a_key_of_non_ascii_digits_sort_without_a_crash() -> None:
    """Findings are sorted in document order (/rules/2 before /rules/10); a key such as '²' passes
    str.isdigit() but not int(): it sorts as a name."""
    from central.policy.validation import Finding, path_key

    paths = ["/rules/10", "/budgets/²", "/rules/2", "/budgets/1"]
    found = sorted([Finding(p, "x") for p in paths], key=path_key)
    assert [f.path for f in found] == ["/budgets/1", "/budgets/²", "/rules/2", "/rules/10"]
