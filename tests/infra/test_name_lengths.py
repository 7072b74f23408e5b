"""Names stay within Azure's limits for the longest inputs the templates accept, offline
(tools/bicep_graph.py bounds each name expression from @maxLength/@allowed, take(), uniqueString()):
every nested deployment name <= 64 (ARM), azd's own deployment name <env>-<unix time> <= 64, and each
resource name within its type's limit (learn.microsoft.com/azure/azure-resource-manager/management/
resource-name-rules). The install script's deployment names: test_install_on_vms.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import pytest

from tools.bicep_check import bicep_files, body_object, name_of, object_properties, parse
from tools.bicep_graph import NameBounds

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
DEPLOYMENT_NAME_LIMIT = 64
AZD_SUFFIX = len("-") + len("1732460000")  # azd names its deployment <env>-<unix time>

# (module symbol in main.bicep, param) -> the limit of the resource name it becomes.
RESOURCE_NAME_LIMITS: Dict[Tuple[str, str], int] = {
    ("identities", "functionIdentityName"): 128,
    ("identities", "vmIdentityName"): 128,
    ("identities", "captureIdentityName"): 128,
    ("monitoring", "workspaceName"): 63,
    ("monitoring", "appInsightsName"): 260,
    ("storage", "storageAccountName"): 24,
    ("storage", "deploymentContainerName"): 63,
    ("artifacts", "storageAccountName"): 24,
    ("eventHubs", "namespaceName"): 50,
    ("keyVault", "keyVaultName"): 24,
    ("functionApp", "planName"): 40,
    ("functionApp", "functionAppName"): 60,
    ("alerts", "actionGroupName"): 260,
}


def _modules(path: Path):
    tree = parse(path)
    for node in tree.root_node.children:
        if node.type == "module_declaration":
            body = body_object(node)
            assert body is not None
            yield tree, name_of(node), object_properties(body)


@pytest.mark.parametrize("path", bicep_files(INFRA), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_nested_deployment_name_fits(path: Path) -> None:
    if path.suffix != ".bicep":
        return
    for tree, symbol, props in _modules(path):
        bound = NameBounds(tree).of(props["name"])
        assert bound is not None, f"{path.name}: module {symbol}: its name has no provable bound"
        assert bound <= DEPLOYMENT_NAME_LIMIT, f"{path.name}: module {symbol}: up to {bound} characters"


def test_azds_deployment_name_fits() -> None:
    bounds = NameBounds(parse(INFRA / "main.bicep"))
    tree = parse(INFRA / "main.bicep")
    (env,) = [n for n in tree.root_node.children if n.type == "parameter_declaration"
              and name_of(n) == "environmentName"]
    longest = bounds.of(env.child_by_field_name("name") or env.children[1])
    assert longest is not None and longest + AZD_SUFFIX <= DEPLOYMENT_NAME_LIMIT, longest


def test_resource_names_fit_their_limits() -> None:
    seen = set()
    for tree, symbol, props in _modules(INFRA / "main.bicep"):
        params = object_properties(props["params"]) if "params" in props else {}
        for name, value in params.items():
            limit = RESOURCE_NAME_LIMITS.get((symbol or "", name))
            if limit is None:
                continue
            seen.add((symbol, name))
            bound = NameBounds(tree).of(value)
            assert bound is not None and bound <= limit, f"{symbol}.{name}: up to {bound}, limit {limit}"
    assert seen == set(RESOURCE_NAME_LIMITS), set(RESOURCE_NAME_LIMITS) - seen
    tree = parse(INFRA / "main.bicep")
    (rg,) = [n for n in tree.root_node.children if n.type == "resource_declaration" and name_of(n) == "rg"]
    body = body_object(rg)
    assert body is not None
    bound = NameBounds(tree).of(object_properties(body)["name"])
    assert bound is not None and bound <= 90, bound


def test_bounds_follow_params_vars_and_functions(tmp_path: Path) -> None:
    (tmp_path / "main.bicep").write_text("""
@maxLength(20)
param short string
@allowed([
  'abc'
  'abcdef'
])
param pick string
param free string
var token = toLower(uniqueString(short))
var both = empty(free) ? 'x-${short}' : '${pick}'
""")
    tree = parse(tmp_path / "main.bicep")
    bounds = NameBounds(tree)
    values = {name_of(n): n.children[-1] for n in tree.root_node.children if n.type == "variable_declaration"}
    assert bounds.of(values["token"]) == 13
    assert bounds.of(values["both"]) == 22
    source = "var a = 'se-${take(free, 30)}-${guid(free)}'\nvar b = '${free}'\n"
    (tmp_path / "main.bicep").write_text(source)
    tree = parse(tmp_path / "main.bicep")
    values = {name_of(n): n.children[-1] for n in tree.root_node.children if n.type == "variable_declaration"}
    assert NameBounds(tree).of(values["a"]) == 3 + 30 + 1 + 36
    assert NameBounds(tree).of(values["b"]) is None  # an unbounded param: no bound can be shown
