"""The C++ core's layers include only what csrc/README.md allows.

The table of csrc/README.md is the one source of the rule: its "May call" column names, in
backticks, the layers (``device/``) and single headers (``aten/alias_pool.h``,
``c10/util/flat_hash_map.h``) a layer may include; "every layer" allows them all. Each
layer may also include its own headers. The layer that the table says is "free of
PyTorch" includes no PyTorch header but the ones its row names.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
_PYTORCH = ("c10/", "ATen/", "torch/", "caffe2/")


def _rules(readme: Path):
    """{layer: (allowed layers, allowed single headers)} and the PyTorch-free layers, from the README's table."""
    rules, pytorch_free = {}, set()
    rows = [r for r in readme.read_text().splitlines() if r.startswith("| `")]
    layers = [re.match(r"\| `(\w+)/` \|", r).group(1) for r in rows]
    for row, layer in zip(rows, layers):
        _, owns, may_call = [c.strip() for c in row.strip("|").split("|")]
        named = re.findall(r"`([^`]+)`", may_call)
        allowed = (
            set(layers) - {layer} if "every layer" in may_call else {n.rstrip("/") for n in named if n.endswith("/")}
        )
        rules[layer] = (allowed, {n for n in named if n.endswith(".h")})
        if "free of PyTorch" in owns:
            pytorch_free.add(layer)
    return layers, rules, pytorch_free


def _violations(csrc: Path):
    layers, rules, pytorch_free = _rules(csrc / "README.md")
    found = []
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in (".h", ".cpp")):
        rel = path.relative_to(csrc)
        layer = rel.parts[0]
        if layer not in rules:
            found.append(f"{rel}: in no layer of csrc/README.md")
            continue
        allowed_layers, allowed_headers = rules[layer]
        for quote, header in _INCLUDE.findall(path.read_text()):
            if quote == '"':
                target = header.split("/")[0]
                if not (csrc / header).is_file():
                    found.append(f'{rel}: #include "{header}" is not relative to csrc/')
                elif target != layer and target not in allowed_layers and header not in allowed_headers:
                    found.append(f'{rel}: #include "{header}": {layer}/ may not include {target}/')
            elif layer in pytorch_free and header.startswith(_PYTORCH) and header not in allowed_headers:
                found.append(f"{rel}: #include <{header}>: {layer}/ is free of PyTorch")
    return found


def test_readme_table_names_every_layer_and_calls_only_downward():
    layers, rules, pytorch_free = _rules(CSRC / "README.md")
    dirs = sorted(p.name for p in CSRC.iterdir() if p.is_dir())
    assert sorted(layers) == dirs
    assert pytorch_free == {"runtime"}
    for i, layer in enumerate(layers):
        upward = sorted(rules[layer][0] - set(layers[i + 1 :]))
        assert upward == [], f"{layer}/ may call only the layers listed below it in csrc/README.md"


def test_every_include_follows_the_readme():
    assert _violations(CSRC) == [], "move the code to a layer that may include it, or change csrc/README.md"


@pytest.mark.parametrize(
    "layer, line, complaint",
    [
        ("runtime", '#include "device/device.h"', "runtime/ may not include device/"),
        ("runtime", "#include <ATen/ATen.h>", "runtime/ is free of PyTorch"),
        ("aten", '#include "distributed/work.h"', "aten/ may not include distributed/"),
        ("distributed", '#include "aten/fallback.h"', "distributed/ may not include aten/"),
        ("amp", '#include "device/device.h"', "amp/ may not include device/"),
    ],
)
def test_a_forbidden_include_is_caught(tmp_path, layer, line, complaint):
    for path in CSRC.rglob("*"):
        if path.is_file() and (path.suffix in (".h", ".cpp") or path.name == "README.md"):
            dest = tmp_path / path.relative_to(CSRC)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text())
    (tmp_path / layer / "added.cpp").write_text(line + "\n")
    assert [v for v in _violations(tmp_path) if complaint in v] != []
