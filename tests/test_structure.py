"""The package's shape: no import cycle in psgd/, layers import only downward, and protocol
names are compared only in the registry (psgd/protocols)."""
import ast
from pathlib import Path

from psgd.protocols import PROTOCOLS

ROOT = Path(__file__).resolve().parents[1]
# each package may import only from the layers below it (and foundation modules at the top)
LAYERS = ["kernels", "nn data compress", "mpi", "collectives ps hogwild gossip pipeline tensor",
          "protocols", "run plan elastic", "simulate", "cli"]
FOUNDATION = {"psgd.errors", "psgd.env", "psgd.config", "psgd.atomic_file", "psgd.halves"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "kernels":
        parts.insert(0, "psgd")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources():
    for base in ("psgd", "kernels"):
        for path in sorted((ROOT / base).rglob("*.py")):
            yield module_name(path), path, ast.parse(path.read_text(), str(path))


def imports(name: str, path: Path, tree: ast.AST, modules: set) -> set:
    """psgd modules that ``name`` imports, anywhere in the file (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict:
    parsed = list(sources())
    modules = {name for name, _, _ in parsed}
    graph = {name: imports(name, path, tree, modules) for name, path, tree in parsed}
    # importing psgd.a.b runs psgd/a/__init__.py first, which is not an edge of its own
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def find_cycle(graph: dict) -> list | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for level, names in enumerate(LAYERS):
        if parts[1] in names.split():
            return level
    return None    # a foundation module (errors, env, config, atomic_file) or a top command


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_psgd_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_package_has_a_layer():
    listed = {name for names in LAYERS for name in names.split()}
    packages = {p.parent.name for p in (ROOT / "psgd").glob("*/__init__.py")}
    assert packages <= listed, f"packages in no layer of LAYERS: {sorted(packages - listed)}"


def test_layers_import_only_downward():
    upward = []
    for module, targets in import_graph().items():
        for target in targets:
            mine, theirs = layer_of(module), layer_of(target)
            if module in FOUNDATION and target not in FOUNDATION:
                upward.append(f"{module} -> {target} (a foundation module)")
            elif mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against the layering: " + ", ".join(sorted(upward))


def protocol_name_comparisons(tree: ast.AST) -> list:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(v, ast.Constant) and v.value in PROTOCOLS for v in values):
                lines.append(node.lineno)
    return lines


def test_the_comparison_finder_sees_names_and_tuples_of_names():
    tree = ast.parse("a == 'bsp'\nb in ('x', 'hogwild')\nc != 'other'\n")
    assert protocol_name_comparisons(tree) == [1, 2]


def test_protocol_names_are_compared_only_in_the_registry():
    found = []
    for name, path, tree in sources():
        if name.startswith("psgd.protocols"):
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in protocol_name_comparisons(tree)]
    assert not found, "protocol name compared outside psgd/protocols: " + ", ".join(found)


def test_no_hasattr_probes_a_protocol_half():
    """The halves' optional parts are methods with defaults (psgd.halves): the job, the worker
    and server families ask an optimizer or a value what it is, never a half what it can do."""
    probed = set()
    for package in ("run", "ps", "hogwild", "collectives", "gossip"):
        for path in sorted((ROOT / "psgd" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                    probed.add(ast.unparse(node.args[0]))
    assert probed <= {"optimizer", "self.optimizer", "value"}, probed
