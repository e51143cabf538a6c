"""Check a psgd wheel holds every package of the tree: psgd/** and kernels/ (as psgd.kernels)."""
import os
import sys
import zipfile


def tree_packages(tree: str) -> set[str]:
    """The package folders a wheel must hold, as wheel paths (psgd/..., psgd/kernels/...)."""
    found = set()
    for top, prefix in (("psgd", "psgd"), ("kernels", "psgd/kernels")):
        for d, dirs, files in os.walk(os.path.join(tree, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            if "__init__.py" in files:
                rel = os.path.relpath(d, os.path.join(tree, top)).replace(os.sep, "/")
                found.add(prefix if rel == "." else f"{prefix}/{rel}")
    return found


def wheel_packages(wheel: str) -> set[str]:
    names = zipfile.ZipFile(wheel).namelist()
    return {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}


if __name__ == "__main__":
    wheel, tree = sys.argv[1], sys.argv[2]
    missing = sorted(tree_packages(tree) - wheel_packages(wheel))
    if missing:
        sys.exit(f"{os.path.basename(wheel)} lacks the packages {', '.join(missing)}")
    print(f"{os.path.basename(wheel)} holds all {len(tree_packages(tree))} packages of the tree")
