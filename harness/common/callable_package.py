"""A package that is also a function: `harness.report(...)` and `harness.results(...)` call a
function of the report while `harness.report.plots` and `harness.results.records` stay modules.

Python binds `harness.<name>` to the package as soon as any of its modules is imported, so the
function has to live on the package object itself: its class becomes a ModuleType subclass with
a `__call__`. The target is imported by name when called, so a leaf package (harness/results)
imports nothing of the layers above it.
"""

import importlib
import sys
import types
from typing import Any


def make_callable(package: str, target: str) -> None:
    """Calling the module `package` calls `target` ("module:function")."""
    module_name, function = target.split(":")

    class CallablePackage(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(importlib.import_module(module_name), function)(*args, **kwargs)

    sys.modules[package].__class__ = CallablePackage
