"""The import rules (tools/import_layers.py): central's packages import only downwards, function_app.py
only the runtime's public face, and no module of central/, forwarder/, schemas/ or tools/ is part of an
import cycle, counting function-level and TYPE_CHECKING imports."""

from __future__ import annotations

from pathlib import Path

from tools.import_layers import LAYERS, problems


def test_the_tree_keeps_its_import_rules() -> None:
    assert problems() == []


def test_every_central_package_is_declared_and_documented() -> None:
    central = Path(__file__).resolve().parent.parent / "central"
    packages = {f"central.{p.parent.name}" for p in central.glob("*/__init__.py")}
    assert packages == set(LAYERS)
    for package in packages:
        doc = (central / package.split(".")[1] / "__init__.py").read_text(encoding="utf-8")
        assert "May import" in doc and "imported by" in doc, f"{package}: say what it may import and who not"


def _tree(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for top in ("central", "forwarder", "schemas", "tools"):
        (root / top).mkdir(exist_ok=True)
        (root / top / "__init__.py").touch()
    return root


def test_a_cycle_through_a_function_level_or_type_checking_import_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "forwarder/a.py": "from .b import x\n",
        "forwarder/b.py": "x = 1\ndef f():\n    from .a import x\n",
        "tools/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tools.d import y\n",
        "tools/d.py": "import tools.c\ny = 2\n",
    })
    found = problems(root)
    assert "import cycle: forwarder.a <-> forwarder.b" in found
    assert "import cycle: tools.c <-> tools.d" in found


def test_an_import_against_the_layers_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "central/__init__.py": "",
        "central/model/__init__.py": "",
        "central/model/times.py": "def f():\n    from central.runtime import service\n",
        "central/runtime/__init__.py": "",
        "central/runtime/service.py": "from central.model.times import f\n",
        "central/cli/__init__.py": "",
        "central/cli/tool.py": "from central.runtime.service import x\n",
        "central/policy/__init__.py": "",
        "central/policy/rules.py": "import forwarder\n",
        "function_app.py": ("from central.runtime.service import CentralService\n"
                            "from central.runtime import ok\n"),
    })
    found = "\n".join(problems(root))
    assert "central.model.times (line 2) imports central.runtime.service" in found
    assert "central.cli.tool (line 1) imports central.runtime.service" in found
    assert "central.policy.rules (line 1) imports forwarder" in found
    assert "function_app (line 1) imports central.runtime.service" in found
    assert "function_app (line 2)" not in found  # the public face is allowed
    assert "central.runtime.service (line 1)" not in found  # downwards is allowed


def test_the_docs_name_every_central_module_and_package() -> None:
    repo = Path(__file__).resolve().parent.parent
    table = (repo / "docs" / "central.md").read_text(encoding="utf-8")
    architecture = (repo / "docs" / "architecture.md").read_text(encoding="utf-8")
    for path in sorted((repo / "central").glob("*/*.py")):
        if path.name != "__init__.py":
            where = f"{path.parent.name}/{path.name}"
            assert f"`{path.name}`" in table, f"docs/central.md's module table misses {where}"
    for package in LAYERS:
        assert f"`{package}`" in architecture, f"docs/architecture.md's package map misses {package}"
