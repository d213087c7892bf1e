"""The dashboard's routes without a browser: the page, its files, the charting library from the plotly
package (gzipped, cached, or a clear message without it), no CDN, the size budget, and no way for our
own code to turn data into markup (the browser tests in tests/e2e show names carrying HTML as text).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import pytest

from stepwatch.protocol.progression import EVAL_PREFIXES
from stepwatch.server.api.routes import web

JS = sorted((web.WEB_DIR / "js").glob("*.js"))


def test_the_page_is_served_at_the_root_with_its_modules(client: Any) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    page = response.text
    assert '<script type="module" src="/ui/js/main.js">' in page
    for module in JS:
        assert f'<link rel="modulepreload" href="/ui/js/{module.name}">' in page, f"{module.name} is not preloaded"
    for path in ("/ui/app.css", *(f"/ui/js/{m.name}" for m in JS)):
        asset = client.get(path)
        assert asset.status_code == 200, path
        assert "etag" in asset.headers
    assert (
        client.get("/ui/js/main.js").headers["content-type"].startswith(("text/javascript", "application/javascript"))
    )


def test_every_import_names_a_file_and_a_name_it_exports() -> None:
    exports = {
        m.name: set(re.findall(r"^export (?:async )?(?:function|const|class|let) (\w+)", m.read_text(), re.M))
        for m in JS
    }
    for module in JS:
        for names, target in re.findall(r'^import \{([^}]*)\} from "\./([\w.]+)";', module.read_text(), re.M):
            assert target in exports, f"{module.name} imports a missing module {target}"
            for name in (n.strip() for n in names.split(",") if n.strip()):
                assert name in exports[target], f"{module.name} imports {name}, which {target} does not export"


def test_the_charting_library_comes_from_the_plotly_package_gzipped_and_cached(client: Any) -> None:
    path = web.charting_library_path()
    assert path is not None, "the server extra installs plotly"
    original = path.read_bytes()
    zipped = client.get("/ui/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert zipped.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.headers["content-type"].startswith("text/javascript")
    assert zipped.content == original  # the client undid the gzip
    assert int(zipped.headers["content-length"]) < len(original) / 2
    plain = client.get("/ui/vendor/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == original
    etag = zipped.headers["etag"]
    again = client.get("/ui/vendor/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert gzip.decompress(web._charting_library().gzipped) == original  # type: ignore[union-attr]


def test_without_plotly_the_page_says_how_to_get_charts(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web, "_charting_library", lambda: None)
    response = client.get("/ui/vendor/plotly.min.js")
    assert response.status_code == 200
    assert "STEPWATCH_NO_CHARTS" in response.text and "pip install 'stepwatch[server]'" in response.text


def test_the_page_loads_nothing_from_elsewhere_and_stays_small() -> None:
    files = [p for p in web.WEB_DIR.rglob("*") if p.is_file() and p.suffix in (".html", ".css", ".js")]
    total = sum(p.stat().st_size for p in files)
    assert total < 200 * 1024, f"our own JS, CSS and HTML are {total / 1024:.0f} KB (budget 200 KB)"
    for p in files:
        text = p.read_text()
        # an SVG namespace is a name, not a download
        found = [u for u in re.findall(r"https?://[^\s\"'`)]+", text) if u != "http://www.w3.org/2000/svg"]
        assert not found, f"{p.name} refers to {found}: no CDN, clusters often have no internet"


@pytest.mark.parametrize("module", JS, ids=lambda p: p.name)
def test_no_data_becomes_markup(module: Path) -> None:
    """Text goes in through textContent and text nodes (dom.h): no innerHTML, outerHTML, insertAdjacentHTML,
    document.write or eval anywhere in our own code."""
    code = module.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, f"{module.name} uses {sink}"


def test_unknown_dashboard_files_are_404_in_the_api_error_shape(client: Any) -> None:
    response = client.get("/ui/js/nothing.js")
    assert response.status_code == 404
    assert response.json()["kind"] == "Status" and response.json()["code"] == 404
    # the API routes are untouched by the dashboard's
    assert client.get("/api/v1/jobs").json() == {"items": [], "total": 0}


def test_the_dashboard_splits_train_and_eval_metrics_as_the_protocol_does() -> None:
    """The panel lists the latest values as OpenShift AI's drawer does, train metrics then eval ones; which
    are eval metrics is the protocol's rule (what the pod serves as ``evalMetrics``), written once in each
    language: the two lists must stay the same."""
    source = (web.WEB_DIR / "js" / "format.js").read_text()
    found = re.search(r"export const EVAL_PREFIXES = \[([^\]]*)\];", source)
    assert found, "format.js no longer declares EVAL_PREFIXES"
    assert tuple(re.findall(r'"([^"]*)"', found.group(1))) == EVAL_PREFIXES
