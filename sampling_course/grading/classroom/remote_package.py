"""The submission's package, importable in the grader under the name the tests import.

While a ``RemotePackage`` is installed in ``sys.meta_path``, ``import exercises.caches`` (say)
gives a ``RemoteModule``: the module is imported in the submission's process, and each
attribute read from it is a handle (``proxies.RemoteObject``) or a value sent over the bridge.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import types
from typing import Any

from sampling_course.grading.classroom.bridge import Endpoint
from sampling_course.grading.classroom.proxies import RemoteObject

__all__ = ["RemoteModule", "RemotePackage"]


class RemoteModule(types.ModuleType):
    """A module of the submission's package; each attribute is asked of the submission's process."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        package: RemotePackage = self.__dict__["_bridge_package"]
        return package.attribute(self.__name__, name)

    def run_beside(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """``function`` of the course's runtime, called with this module in the submission's process
        (``RemoteObject.run_beside``): how a test's double is made beside the code it is handed to."""
        package: RemotePackage = self.__dict__["_bridge_package"]
        return RemoteObject.run_beside(package.handle(self.__name__), function, *args, **kwargs)


class RemotePackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``<name>`` and ``<name>.<module>`` as RemoteModules while installed in ``sys.meta_path``.

    ``connect`` gives the current endpoint (a fresh process after one was stopped); each
    module is imported there again when the endpoint changes.
    """

    def __init__(self, name: str, modules: set[str], connect: Any):
        self.name = name
        self.modules = set(modules)
        self.connect = connect
        self._handles: dict[str, tuple[Endpoint, RemoteObject]] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, module = fullname.partition(".")
        if package != self.name or "." in module or (module and module not in self.modules):
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=f"<submission>/{fullname}",
                                               is_package=not module)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = RemoteModule(spec.name)
        module.__dict__["_bridge_package"] = self
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self.handle(module.__name__)  # import it there now: an import error shows up as one here

    def handle(self, fullname: str) -> RemoteObject:
        endpoint = self.connect()
        known = self._handles.get(fullname)
        if known is not None and known[0] is endpoint:
            return known[1]
        remote = endpoint.request("import", None, name=fullname)
        self._handles[fullname] = (endpoint, remote)
        return remote

    def attribute(self, fullname: str, name: str) -> Any:
        return getattr(self.handle(fullname), name)
