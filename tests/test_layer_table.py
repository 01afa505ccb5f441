"""docs/architecture.md's layer table and the import-linter contracts in pyproject.toml say the
same thing.

Both files are read as they are; nothing here names a layer or a module. The table is the one
whose header has the columns `layer`, `code` and `must not import`:

- `code` names each layer's modules in backticks (`app/api/`, `workers/route/policies.py`); a
  module belongs to the layer whose code is its longest prefix (so `app/` is the rest of app).
- `must not import` names other layers by their `layer` text, and modules in backticks
  (`flask`, or one module of ours). Text in parentheses is commentary and is not read.

Checked both ways, for the `forbidden` and `layers` contracts (an acyclic contract has no
direction to state):
- every rule of a contract appears in the table: the layer of a source module says it must not
  import the layer of the forbidden module (or names the external module);
- every "must not import" of the table is enforced by a contract whose sources cover the layer
  and whose forbidden modules cover what it names.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from itertools import permutations

from tests.environment import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"


@dataclass(frozen=True)
class Layer:
    name: str
    code: tuple[str, ...]  # dotted module names
    forbidden_layers: frozenset[str]
    forbidden_modules: frozenset[str]  # dotted names from backticks


def _outside_parentheses(text: str) -> str:
    while (stripped := re.sub(r"\([^()]*\)", " ", text)) != text:
        text = stripped
    return text


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _dotted(path: str) -> str:
    return path.strip().strip("/").removesuffix(".py").replace("/", ".")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def read_layer_table(text: str) -> list[Layer]:
    """The layers of the first table whose header has `layer`, `code`, `must not import`."""
    lines = text.splitlines()
    headers = [(at, [cell.lower() for cell in _cells(line)]) for at, line in enumerate(lines)
               if line.lstrip().startswith("|")]
    found = [(at, header) for at, header in headers
             if {"layer", "code", "must not import"} <= set(header)]
    assert found, f"{ARCHITECTURE.name}: no table with the columns layer, code, must not import"
    at, header = found[0]
    rows = []
    for line in lines[at + 2:]:
        if not line.lstrip().startswith("|"):
            break
        rows.append(dict(zip(header, _cells(line), strict=True)))
    names = [_outside_parentheses(row["layer"]).strip() for row in rows]
    layers = []
    for name, row in zip(names, rows, strict=True):
        forbids = _outside_parentheses(row["must not import"])
        words = re.sub(r"`[^`]*`", " ", forbids).lower()
        layers.append(Layer(
            name=name,
            code=tuple(_dotted(p) for p in _backticked(_outside_parentheses(row["code"]))),
            forbidden_layers=frozenset(
                other for other in names
                if re.search(rf"\b{re.escape(other.lower())}\b", words)),
            forbidden_modules=frozenset(_dotted(m) for m in _backticked(forbids)),
        ))
    return layers


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layers_of(module: str, layers: list[Layer]) -> list[Layer]:
    """The layers whose code is the longest prefix of `module` (several when tied)."""
    matches = [(len(code), layer) for layer in layers for code in layer.code
               if _within(module, code)]
    longest = max((length for length, _ in matches), default=0)
    return list(dict.fromkeys(layer for length, layer in matches if length == longest))


def contract_rules(contract: dict) -> list[tuple[str, str]]:
    """(importer, imported) module pairs a forbidden or layers contract rules out."""
    if contract["type"] == "forbidden":
        return [(source, forbidden) for source in contract["source_modules"]
                for forbidden in contract["forbidden_modules"]]
    if contract["type"] == "layers":
        rules = []
        for container in contract.get("containers", [""]):
            levels = [[[f"{container}.{m.strip()}".strip(".") for m in part.split(":")]
                       for part in level.split("|")] for level in contract["layers"]]
            for high, level in enumerate(levels):
                modules = [m for part in level for m in part]
                for higher in levels[:high]:  # a lower layer imports no higher one
                    rules += [(low, up) for low in modules for part in higher for up in part]
                if len(level) > 1:  # `|`: independent siblings import each other in no way
                    rules += [(a, b) for one, two in permutations(level, 2)
                              for a in one for b in two]
        return rules
    return []


def _contracts() -> list[dict]:
    linter = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return linter["contracts"]


def _ours(module: str) -> bool:
    linter = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return any(_within(module, root) for root in linter["root_packages"])


def _states(layer: Layer, imported: str, layers: list[Layer]) -> bool:
    """Whether the table says `layer` must not import `imported`."""
    if any(_within(imported, named) for named in layer.forbidden_modules):
        return True
    if not _ours(imported):
        return False
    return any(target.name in layer.forbidden_layers for target in layers_of(imported, layers))


def test_the_layer_table_names_every_layer_once_with_its_code() -> None:
    layers = read_layer_table(ARCHITECTURE.read_text())
    names = [layer.name for layer in layers]
    assert len(set(names)) == len(names), f"a layer named twice: {names}"
    assert all(layer.code for layer in layers), [layer.name for layer in layers if not layer.code]


def test_every_contract_rule_is_stated_in_the_layer_table() -> None:
    layers = read_layer_table(ARCHITECTURE.read_text())
    missing = set()
    for contract in _contracts():
        for importer, imported in contract_rules(contract):
            sources = layers_of(importer, layers)
            if not sources:
                missing.add(f"{contract['id']}: {importer} is in no layer's code")
            elif not any(_states(source, imported, layers) for source in sources):
                where = " or ".join(source.name for source in sources)
                what = (" or ".join(t.name for t in layers_of(imported, layers))
                        if _ours(imported) else f"`{imported}`")
                missing.add(f"{contract['id']} forbids {importer} -> {imported}: the row "
                            f"{where!r} does not say it must not import {what or imported}")
    assert not missing, "\n".join(sorted(missing))


def _covers(source: str, layer: Layer) -> bool:
    return any(_within(code, source) or _within(source, code) for code in layer.code)


def _reaches(imported: str, target: Layer, layers: list[Layer]) -> bool:
    """Whether forbidding `imported` forbids (some of) `target`: it lies in the target's code,
    or the target's code lies in it."""
    return (target in layers_of(imported, layers)
            or any(_within(code, imported) for code in target.code))


def test_every_must_not_import_of_the_table_is_enforced_by_a_contract() -> None:
    layers = read_layer_table(ARCHITECTURE.read_text())
    by_name = {layer.name: layer for layer in layers}
    rules = [rule for contract in _contracts() for rule in contract_rules(contract)]
    unenforced = []
    for layer in layers:
        for named in sorted(layer.forbidden_layers):
            target = by_name[named]
            if not any(_covers(importer, layer) and _reaches(imported, target, layers)
                       for importer, imported in rules):
                unenforced.append(f"{layer.name} must not import {named}: no contract says so")
        for module in sorted(layer.forbidden_modules):
            if not any(_covers(importer, layer) and _within(module, imported)
                       for importer, imported in rules):
                unenforced.append(f"{layer.name} must not import `{module}`: no contract says so")
    assert not unenforced, "\n".join(unenforced)


def test_the_reader_finds_rules_and_disagreements() -> None:
    """The checks above can fail: a table and contracts that disagree, read the same way."""
    table = """
| layer | code | may import | must not import |
|---|---|---|---|
| core | `pkg/core/` | nothing | the rest (it is pure); `flask` |
| rest | `pkg/` | core | nothing |
"""
    core, rest = read_layer_table(table)
    assert core.code == ("pkg.core",) and core.forbidden_layers == {"rest"}
    assert core.forbidden_modules == {"flask"} and not rest.forbidden_layers
    assert layers_of("pkg.core.sim", [core, rest]) == [core]
    assert layers_of("pkg.api", [core, rest]) == [rest]
    layered = {"type": "layers", "containers": ["pkg"], "layers": ["a | b", "c"]}
    assert set(contract_rules(layered)) == {("pkg.c", "pkg.a"), ("pkg.c", "pkg.b"),
                                            ("pkg.a", "pkg.b"), ("pkg.b", "pkg.a")}
    forbidden = {"type": "forbidden", "source_modules": ["pkg"], "forbidden_modules": ["redis"]}
    assert contract_rules(forbidden) == [("pkg", "redis")]
    assert not _states(rest, "redis", [core, rest])  # the table does not say it: a failure
