"""Registries by definition: a package's classes of one base, found by importing every module of the package.

A new policy or task is its file and its config, nothing else: `discover` imports each module of the package,
then walks the base's subclasses and keeps those defined inside the package (a test's subclass stays out) that
set their own `name` and are not marked `abstract`. Sorted by name.
"""

import importlib
import pkgutil


def discover(package: str, path, base: type) -> dict[str, type]:
    """name -> class for every subclass of `base` defined in a module of `package` (`path`: its `__path__`)."""
    for info in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{info.name}")
    out, stack = {}, [base]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            own = vars(sub)
            if sub.__module__.startswith(package + ".") and "name" in own and not own.get("abstract", False):
                out[sub.name] = sub
    return dict(sorted(out.items()))
