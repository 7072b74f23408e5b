"""The Windows pieces that run on Linux too: the hooks' Windows environment (a pure function), the
install plan (ntpath), the ._pth edit, the config the install writes, uninstall, and the ledger's
cross-process lock (real processes racing on one file). tests/vm_windows runs them on Windows CPython
under Wine."""

from __future__ import annotations

import base64
import json
import ntpath
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forwarder import hooks, windows_install
from forwarder.approvals.ledger import FILE_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def test_hooks_on_windows_get_the_system_path_and_no_service_secrets() -> None:
    service = {"SYSTEMROOT": "D:\\Win", "COMSPEC": "D:\\Win\\system32\\cmd.exe", "PROGRAMDATA": "D:\\PD",
               "PATH": "C:\\evil", "SE_FORWARDER_QUEUE_CONNECTION_STRING": "secret", "TEMP": "D:\\T"}
    env = hooks.base_environment(True, service)
    assert env["PATH"].split(";") == ["D:\\Win\\system32", "D:\\Win", "D:\\Win\\System32\\Wbem",
                                      "D:\\Win\\System32\\WindowsPowerShell\\v1.0\\"]
    assert env["SystemRoot"] == env["windir"] == "D:\\Win" and env["SystemDrive"] == "D:"
    assert env["ProgramData"] == "D:\\PD" and env["TEMP"] == "D:\\T"
    assert ".CMD" in env["PATHEXT"] and env["ComSpec"].endswith("cmd.exe")
    assert "secret" not in json.dumps(env)


def test_hooks_on_windows_without_systemroot_fall_back_to_c_windows() -> None:
    env = hooks.base_environment(True, {})
    assert env["PATH"].startswith("C:\\Windows\\system32;") and env["SystemDrive"] == "C:"


def test_hooks_on_linux_keep_the_fixed_search_path() -> None:
    assert hooks.base_environment(False, {"PATH": "/home/x/bin"}) == {
        "PATH": hooks.HOOK_PATH, "LANG": "C.UTF-8", "HOME": "/"}


def test_plan_lays_out_program_files_and_programdata() -> None:
    where = windows_install.layout({"PROGRAMFILES": "C:\\Program Files", "ProgramData": "C:\\ProgramData"})
    assert where.prefix == "C:\\Program Files\\se-forwarder"
    assert where.python_exe == "C:\\Program Files\\se-forwarder\\python\\python.exe"
    assert where.state_dir == "C:\\ProgramData\\se-forwarder\\state"
    assert where.config_path == "C:\\ProgramData\\se-forwarder\\config.json"
    assert where.hook_dir == "C:\\ProgramData\\se-forwarder\\hooks"
    plan = windows_install.plan(where)
    assert plan["daemon"] == [where.python_exe, "-m", "forwarder", "run", "--config", where.config_path]
    assert f'-Python "{where.python_exe}"' in plan["task"]["argument"]
    assert plan["task"]["user"] == "LOCAL SERVICE"
    state_acl = plan["acl"][2]
    assert state_acl[1] == where.state_dir and state_acl[-1] == "*S-1-5-19:(OI)(CI)M"
    assert all(f"{windows_install.LOCAL_SERVICE}:(OI)(CI)RX" in c for c in plan["acl"][:2])


def test_enable_site_turns_site_on_and_keeps_the_rest() -> None:
    shipped = "python313.zip\r\n.\r\n\r\n# Uncomment to run site.main() automatically\r\n#import site\r\n"
    edited = windows_install.enable_site(shipped)
    assert edited.splitlines() == ["python313.zip", ".", "", "# Uncomment to run site.main() automatically",
                                   "import site"]
    assert windows_install.enable_site(edited) == edited
    assert windows_install.enable_site("python313.zip\n.\n").splitlines()[-1] == "import site"


def test_config_gets_the_layouts_directories_unless_it_names_its_own() -> None:
    where = windows_install.layout({})
    text = windows_install.config_text(b'{"sink": "eventhubs", "state_dir": "D:\\\\own"}', where)
    assert json.loads(text) == {"sink": "eventhubs", "state_dir": "D:\\own", "hook_dir": where.hook_dir}
    for bad, why in ((b"{", "not valid JSON"), (b"[1]", "JSON object")):
        with pytest.raises(windows_install.InstallError, match=why):
            windows_install.config_text(bad, where)


def test_cli_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert windows_install.main(["stage", "--bundle", "/nonexistent", "--config-base64", "!!"], env={}) == 2
    assert capsys.readouterr().err.strip() == ("se-forwarder windows-install: error: "
                                               "--config-base64 is not valid base64")
    good = base64.b64encode(b"{}").decode()
    assert windows_install.main(["stage", "--bundle", "/nonexistent", "--config-base64", good], env={}) == 2
    assert "the bundle is incomplete: python, wheels" in capsys.readouterr().err


def test_uninstall_keeps_outbox_and_added_hooks_unless_purge(tmp_path: Path) -> None:
    env = {"ProgramFiles": str(tmp_path / "pf"), "ProgramData": str(tmp_path / "pd")}
    where = windows_install.layout(env)
    native = {k: v.replace("\\", os.sep) for k, v in vars(where).items()}  # ntpath.join gave '\\'
    for d in ("python_dir", "state_dir"):
        Path(native[d]).mkdir(parents=True)
    Path(native["config_path"]).write_text("{}")
    pre = Path(native["hook_dir"]) / "pre-approve.d"
    pre.mkdir(parents=True)
    (pre / "50-drain.cmd.example").write_text("rem")
    (pre / "10-mine.cmd").write_text("rem")
    (Path(native["state_dir"]) / "outbox.sqlite").write_text("")
    local = windows_install.Layout(**native)
    removed = windows_install.uninstall(local, purge=False)
    assert native["prefix"] in removed and native["config_path"] in removed
    assert (pre / "10-mine.cmd").exists() and not (pre / "50-drain.cmd.example").exists()
    assert (Path(native["state_dir"]) / "outbox.sqlite").exists()
    assert windows_install.uninstall(local, purge=True) == [native["data_dir"]]
    assert not Path(native["data_dir"]).exists() and ntpath.isabs(where.prefix)


def test_ledger_writers_in_two_processes_lose_nothing(tmp_path: Path) -> None:
    """Two processes each record 60 events through the ledger's read-modify-write: every entry survives
    (without the file lock, each saves the file it read before the other's write and entries vanish)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = str(HERE / "ledger_race_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(tmp_path), name, "60"], env=env,
                              stdout=subprocess.PIPE, text=True) for name in ("daemon", "approve")]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    events = json.loads((tmp_path / FILE_NAME).read_text())["events"]
    assert sorted(events) == sorted(f"{n}-{i}" for n in ("daemon", "approve") for i in range(60))


def test_the_powershell_installer_runs_the_same_steps_from_the_same_places() -> None:
    """install-forwarder.ps1 is thin: it bootstraps windows_install exactly as the Wine suite does, and
    finds the installed interpreter where the plan puts it."""
    script = (REPO / "infra" / "forwarder" / "install-forwarder.ps1").read_text()
    assert f'$Bootstrap = "{windows_install.BOOTSTRAP}"' in script
    where = windows_install.layout({"ProgramFiles": "C:\\PF"})
    assert where.python_exe == ntpath.join("C:\\PF", "se-forwarder\\python\\python.exe")
    assert '$Installed = Join-Path $env:ProgramFiles "se-forwarder\\python\\python.exe"' in script
    for step in ("plan", "stage --bundle $work @configArgs", "activate", "windows-install @removeArgs"):
        assert step in script, step
    host = (REPO / "infra" / "forwarder" / "run-forwarder.ps1").read_text()
    assert "& $Python -m forwarder run --config $Config" in host
    assert "-Python" in windows_install.task_arguments(where)["argument"]


def test_the_bundle_interpreter_is_refused_unless_its_bytes_are_the_pinned_ones(tmp_path: Path) -> None:
    from tools import embedded_python

    archive = tmp_path / "python-embed.zip"
    archive.write_bytes(b"not python.org's zip")
    with pytest.raises(embedded_python.EmbedError, match="not the pinned"):
        embedded_python.verified(archive)
    assert embedded_python.verified(archive, embedded_python.sha256(archive)) == archive
    (tmp_path / "python.exe").write_bytes(b"MZ")
    with pytest.raises(embedded_python.EmbedError, match=r"python313\.dll, python313\.zip, python313\._pth"):
        embedded_python.check_layout(tmp_path)
    version = embedded_python.VERSION
    assert embedded_python.URL == f"https://www.python.org/ftp/python/{version}/python-{version}-embed-amd64.zip"
