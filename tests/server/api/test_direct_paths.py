"""``DirectRoutes.find`` remembers what each path matched: its answers are those of matching every request
afresh, for the app's own routes, any method, and paths seen before or not."""

from __future__ import annotations

import random
from typing import Any

from starlette.routing import Route

from stepwatch.server.api import direct
from stepwatch.server.api.direct import DirectRoutes
from stepwatch.server.api.routes import ingest as ingest_routes


async def _plain(request: Any) -> Any:
    raise AssertionError


def _routes() -> DirectRoutes:
    endpoint = ingest_routes.report
    routes = [
        Route("/r/{x}/reports", endpoint, methods=["POST"]),
        Route("/n/{x:int}", endpoint, methods=["POST", "PUT"]),
        Route("/any/{x:path}", endpoint),
        Route("/p", _plain),
        Route("/r/{x}/later", endpoint, methods=["POST"]),  # behind a plain route: never direct
    ]
    return DirectRoutes(routes, {Exception: _plain, KeyError: _plain, direct.HTTPException: _plain})


def _afresh(routes: DirectRoutes, scope: dict[str, Any]) -> Any:
    """What ``find`` answered before it remembered paths: the leading routes matched in turn."""
    if not routes._routes or scope.get("root_path") or scope["type"] != "http":
        return None
    for regex, methods, convertors, route, func in routes._routes:
        match = regex.match(scope["path"])
        if match is None:
            continue
        if methods is not None and scope["method"] not in methods:
            return None
        return route, func, {key: convertors[key].convert(value) for key, value in match.groupdict().items()}
    return None


def test_a_path_finds_what_matching_it_afresh_finds() -> None:
    rng = random.Random(11)
    routes = _routes()
    paths = ["/r/a/reports", "/r/a/reports/", "/n/12", "/n/x", "/any/a/b", "/p", "/r/a/later", "/", "/r//reports"]
    paths += [
        rng.choice(["/r/", "/n/", "/any/", "/x/"]) + rng.choice(["1", "a", "a/b", "7/reports"]) for _ in range(300)
    ]
    paths += [f"/r/{rng.choice(paths)}/reports" for _ in range(100)]
    for _ in range(2):  # the second round reads what the first remembered
        for path in paths:
            for method in ("POST", "GET", "PUT"):
                for root in ("", "/r"):
                    scope = {"type": "http", "method": method, "path": path, "root_path": root}
                    found, expected = routes.find(scope), _afresh(routes, scope)
                    assert found == expected, scope
                    if found is not None:
                        assert type(found[2]["x"]) is type(expected[2]["x"])
    assert routes.find({"type": "websocket", "path": "/r/a/reports", "root_path": ""}) is None


def test_the_paths_remembered_are_bounded() -> None:
    routes = _routes()
    for i in range(10_000):
        assert routes.find({"type": "http", "method": "POST", "path": f"/r/job-{i}/reports", "root_path": ""})
    assert 0 < len(routes._known) <= direct._KNOWN_PATHS
