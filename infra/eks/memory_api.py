"""An in-memory Kubernetes API (kmock's emulator) on 127.0.0.1, for the emulator target and tests.

It stores objects and serves create/get/patch/delete and API discovery, but runs no
controllers: nothing schedules pods or fills in a Deployment's status. It can stand in for
a cluster's API to exercise apply and teardown, not to validate manifests or roll them out.
"""
from __future__ import annotations

import asyncio
import re
import threading
from typing import Iterable

from infra.eks.kube import KINDS


class InMemoryKubernetes:
    """Runs kmock's KubernetesEmulator in a background thread with its own event loop."""

    def __init__(self, served: Iterable[tuple[str, str]] | None = None):
        """``served``: (apiVersion, kind) pairs whose API the fake cluster advertises (as if
        their CRDs or add-ons were installed); default every kind Spectrum renders."""
        self.served = list(served) if served is not None else None
        self.url: str = ""
        self.emulator = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10) -> str:
        try:
            import kmock  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("the in-memory Kubernetes API needs kmock (Python >= 3.11): "
                               "pip install 'spectrum[emulator]'") from exc
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, errors), daemon=True,
                                        name="in-memory-kubernetes")
        self._thread.start()
        if not ready.wait(timeout_s) or errors:
            raise RuntimeError(f"the in-memory Kubernetes API did not start: {errors[:1]}")
        return self.url

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        async def main() -> None:
            from kmock._internal.apps import Server

            try:
                async with _emulator_class()() as emulator, Server(emulator) as server:
                    self._declare(emulator)
                    self.emulator, self.url = emulator, str(server.url).rstrip("/")
                    self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                    ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()

        asyncio.run(main())

    def _declare(self, emulator) -> None:
        import kmock


        wanted = self.served
        if wanted is None:
            wanted = [(api_version, kind) for kind, (api_version, _, _) in KINDS.items()]
        for api_version, kind in wanted:
            _, plural, namespaced = KINDS[kind]
            emulator.resources[f"{api_version}/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced)

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(timeout=10)

    def __enter__(self) -> "InMemoryKubernetes":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _emulator_class():
    """kmock's emulator, plus Namespace objects: kmock parses /api/v1/namespaces/NAME as a
    namespace prefix, not as an object, so those paths are served here before its parser."""
    import aiohttp.web
    import attrs
    import kmock

    one = re.compile(r"^/api/v1/namespaces/([^/]+)$")

    @attrs.define(kw_only=True)
    class EmulatorWithNamespaces(kmock.KubernetesEmulator):
        namespaces: dict = attrs.field(factory=dict)

        async def __call__(self, raw_request):
            path, method = raw_request.path, raw_request.method.upper()
            match = one.match(path)
            if path == "/api/v1/namespaces" and method == "POST":
                body = await raw_request.json()
                name = body["metadata"]["name"]
                if name in self.namespaces:
                    return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
                self.namespaces[name] = body
                return aiohttp.web.json_response(body, status=201)
            if path == "/api/v1/namespaces" and method == "GET":
                return aiohttp.web.json_response({"kind": "NamespaceList",
                                                  "items": list(self.namespaces.values())})
            if match:
                name = match.group(1)
                if name not in self.namespaces:
                    return _status(404, "NotFound", f'namespaces "{name}" not found')
                if method == "DELETE":
                    return aiohttp.web.json_response(self.namespaces.pop(name))
                if method == "PATCH":
                    self.namespaces[name] = {**self.namespaces[name], **(await raw_request.json())}
                return aiohttp.web.json_response(self.namespaces[name])
            return await super().__call__(raw_request)

    return EmulatorWithNamespaces


def _status(code: int, reason: str, message: str):
    import aiohttp.web

    return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                      "code": code, "reason": reason, "message": message},
                                     status=code)
