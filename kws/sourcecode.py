"""The kws source files a script runs, found from its imports, and a digest of them.

Two users: the workflow declares each stage's code inputs with `imported_files` (so an edit of any kws
module a stage imports reruns it, and a module nobody imports reruns nothing), and the trainer puts
`code_digest` into its run fingerprint (so resuming never continues a run trained by other code).

Imports are read statically (ast) and followed through the kws package transitively, function-level
imports included: the closure is what the script *can* run, known without importing torch.
"""

import ast
import hashlib
from pathlib import Path

PACKAGE = "kws"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds kws/


def _module_file(name, root):
    """kws.a.b -> root/kws/a/b.py or root/kws/a/b/__init__.py (None when it is no kws module)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path, root):
    """root/kws/a/b.py -> kws.a.b; root/kws/a/__init__.py -> kws.a; None outside the package."""
    try:
        parts = list(Path(path).resolve().relative_to(root).with_suffix("").parts)
    except ValueError:
        return None
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and parts[0] == PACKAGE else None


def _imported_names(path, root):
    """Every module name an import statement in `path` may load (submodules of `from x import y` too)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    own = _module_name(path, root)
    is_package = Path(path).name == "__init__.py"
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = own.split(".") if is_package else own.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def imported_files(*entry_points, root=PACKAGE_ROOT):
    """Sorted kws source files (paths relative to `root`) that the given scripts or modules import.

    `entry_points` are paths of scripts or kws modules. Importing kws.a.b runs kws/__init__.py and
    kws/a/__init__.py too, so those are included. The entry points themselves are not listed unless
    they are kws modules imported by another.
    """
    root = Path(root).resolve()
    seen = set()
    todo = [Path(p).resolve() for p in entry_points]
    found = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path, root):
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # parent packages run first
                module = _module_file(".".join(parts[:depth]), root)
                if module is not None and module not in found:
                    found.add(module)
                    todo.append(module)
    return sorted(str(p.relative_to(root)) for p in found)


def code_digest(files, root=PACKAGE_ROOT):
    """sha256 (16 hex digits) of the files' relative names and contents: equal code, equal digest,
    wherever the project folder lies."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for name in sorted(str(Path(f).resolve().relative_to(root)) if Path(f).is_absolute() else str(f) for f in files):
        digest.update(name.encode() + b"\0")
        digest.update((root / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
