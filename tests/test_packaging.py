"""The wheel holds every package of the tree, and requires-python matches what the code imports."""
import ast
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("wheel_contents",
                                              os.path.join(ROOT, ".ci", "wheel_contents.py"))
wheel_contents = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheel_contents)

# the first Python whose standard library has each module, and the backport that would let
# requires-python go lower (psgd chose 3.11 rather than tomli on 3.10)
STDLIB_SINCE = {"tomllib": ((3, 11), "tomli")}


def _imported_modules() -> set[str]:
    names = set()
    for top in ("psgd", "kernels"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    tree = ast.parse(open(os.path.join(d, f), encoding="utf-8").read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            names.update(a.name.split(".")[0] for a in node.names)
                        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                            names.add(node.module.split(".")[0])
    return names


def test_requires_python_covers_the_stdlib_modules_the_code_imports():
    meta = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    floor = tuple(int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", meta["requires-python"]).groups())
    deps = " ".join(meta["dependencies"])
    for module, (since, backport) in STDLIB_SINCE.items():
        if module in _imported_modules() and backport not in deps:
            assert floor >= since, (f"psgd imports {module} (Python {since[0]}.{since[1]}+) but "
                                    f"requires-python is {meta['requires-python']}")


def test_wheel_contents_names_a_package_left_out(tmp_path):
    full = wheel_contents.tree_packages(ROOT)
    assert {"psgd", "psgd/kernels", "psgd/compress", "psgd/ps/compensation"} <= full
    wheel = tmp_path / "psgd-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for p in sorted(full - {"psgd/compress"}):
            z.writestr(f"{p}/__init__.py", "")
    assert full - wheel_contents.wheel_packages(str(wheel)) == {"psgd/compress"}
    run = subprocess.run([sys.executable, os.path.join(ROOT, ".ci", "wheel_contents.py"),
                          str(wheel), ROOT], capture_output=True, text=True)
    assert run.returncode != 0 and "lacks the packages psgd/compress" in run.stderr


@pytest.mark.slow
def test_wheel_built_from_the_tree_holds_every_package(tmp_path):
    """pip wheel (as a cluster's pip install . or a wheel would build it), then its packages."""
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                          str(tmp_path), ROOT], capture_output=True, text=True)
    if run.returncode != 0 and "Could not find a version" in run.stderr:
        pytest.skip("no index to fetch setuptools from for the isolated build")
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("psgd-*.whl")
    missing = wheel_contents.tree_packages(ROOT) - wheel_contents.wheel_packages(str(wheel))
    assert not missing, f"the wheel lacks {sorted(missing)}"
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith("kernels/") for n in names), "kernels/ must install as psgd.kernels"
