"""The project check (tools/bicep_check.py): module paths, module params, symbols, the .bicepparam.

First infra/ itself must be clean; then each rule is shown to catch a broken snippet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from tools.bicep_check import check_tree, main

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"

MODULE = """
@description('needed')
param name string
param size int = 1
param maybe string?
output id string = '${name}-${size}-${maybe ?? ''}'
"""


def _findings(tmp_path: Path, files: Dict[str, str]) -> List[str]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [f.message for f in check_tree(tmp_path)]


def test_infra_passes_the_project_check() -> None:
    findings = check_tree(INFRA)
    assert findings == [], "\n".join(map(str, findings))


def test_cli_exit_codes(tmp_path: Path) -> None:
    assert main([str(INFRA)]) == 0
    (tmp_path / "main.bicep").write_text("output x string = nothere\n")
    assert main([str(tmp_path)]) == 1


def test_a_correct_composition_has_no_finding(tmp_path: Path) -> None:
    main_bicep = """
param n int
var names = [for (item, i) in range(0, n): 'vm${i}-${item}']
var upper = map(names, x => toUpper(x))
module m 'mod/m.bicep' = [for name in names: {
  name: 'deploy-${name}'
  params: {
    name: name
  }
}]
output first string = m[0].outputs.id
output count int = length(upper)
"""
    assert _findings(tmp_path, {"main.bicep": main_bicep, "mod/m.bicep": MODULE}) == []


def test_missing_module_file(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"main.bicep": "module m 'mod/nope.bicep' = {\n  name: 'm'\n}\n"})
    assert any("does not exist" in f for f in found)


def test_registry_module_is_refused(tmp_path: Path) -> None:
    main_bicep = "module m 'br/public:avm/res/storage:0.1.0' = {\n  name: 'm'\n}\n"
    found = _findings(tmp_path, {"main.bicep": main_bicep})
    assert any("only local module files" in f for f in found)


def test_unknown_module_param(tmp_path: Path) -> None:
    main_bicep = ("module m 'mod/m.bicep' = {\n  name: 'm'\n  params: {\n    name: 'a'\n"
                  "    colour: 'red'\n  }\n}\n")
    found = _findings(tmp_path, {"main.bicep": main_bicep, "mod/m.bicep": MODULE})
    assert any("unknown param 'colour'" in f for f in found)


def test_missing_required_module_param(tmp_path: Path) -> None:
    main_bicep = "module m 'mod/m.bicep' = {\n  name: 'm'\n  params: {\n    size: 2\n  }\n}\n"
    found = _findings(tmp_path, {"main.bicep": main_bicep, "mod/m.bicep": MODULE})
    assert any("required param 'name'" in f for f in found)
    # defaulted and nullable params are optional
    assert not any("'size'" in f or "'maybe'" in f for f in found)


def test_undeclared_identifier(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"main.bicep": "param a string\nvar b = '${a}-${c}'\noutput o string = b\n"})
    assert found == ["undeclared identifier 'c'"]


def test_loop_variable_out_of_scope(tmp_path: Path) -> None:
    main_bicep = "var xs = [for x in range(0, 2): x]\noutput o int = x\noutput n int = length(xs)\n"
    found = _findings(tmp_path, {"main.bicep": main_bicep})
    assert found == ["undeclared identifier 'x'"]


def test_unknown_function_and_decorator(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"main.bicep": "@descripton('typo')\nparam a string\nvar b = toUpperr(a)\n"})
    assert "unknown decorator 'descripton'" in found and "unknown function 'toUpperr'" in found


def test_unknown_function_inside_a_multiline_array(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"main.bicep": "var a = [\n  resourceGroupp().id\n]\noutput o array = a\n"})
    assert found == ["unknown function 'resourceGroupp'"]


def test_bicepparam_using_target_missing(tmp_path: Path) -> None:
    found = _findings(tmp_path, {"main.bicepparam": "using './gone.bicep'\nparam a = 1\n"})
    assert any("does not exist" in f for f in found)


def test_bicepparam_unknown_and_missing_params(tmp_path: Path) -> None:
    found = _findings(tmp_path, {
        "main.bicep": "param needed string\nparam optional int = 1\noutput o string = needed\n",
        "main.bicepparam": "using './main.bicep'\nparam optinal = 2\n",
    })
    assert "param 'optinal' is not declared in ./main.bicep" in found
    assert "required param 'needed' of ./main.bicep not set" in found


def test_every_main_parameter_is_in_the_deploy_doc() -> None:
    from tools.bicep_check import declared_params, parse

    doc = (REPO / "docs" / "deploy.md").read_text()
    missing = [name for name in declared_params(parse(INFRA / "main.bicep")) if f"| `{name}` |" not in doc]
    assert missing == [], f"parameters missing from docs/deploy.md's table: {missing}"
