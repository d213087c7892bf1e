"""Issue 21, items 1 and 7, in headless Chromium: a page served from another localhost port tries to stop a
job and create one (fetch with text/plain and no-cors, a form POST); the server refuses each and the job
is untouched. The dashboard itself keeps working under its Content-Security-Policy, with no violation.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

ATTACK = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{api}/jobs">
<input name='{{"name":"train","supersede":true,"x":"' value='"}}'></form>
<form id="g" method="POST" action="{api}/jobs/train/commands"><input name="kind" value="stop"></form>
<iframe name="sink"></iframe>
<script>
window.results = [];
async function attack() {{
  const tries = [
    ["{api}/jobs/train/commands", {{method: "POST", mode: "no-cors", body: '{{"kind":"stop"}}',
      headers: {{"Content-Type": "text/plain"}}}}],
    ["{api}/jobs", {{method: "POST", mode: "no-cors", body: '{{"name":"planted"}}'}}],
    ["{api}/jobs/train/commands", {{method: "POST", body: '{{"kind":"stop"}}',
      headers: {{"Content-Type": "application/json"}}}}],
  ];
  for (const [url, init] of tries) {{
    try {{ const r = await fetch(url, init); window.results.push(r.type + ":" + r.status); }}
    catch (e) {{ window.results.push("error:" + e.message); }}
  }}
  document.getElementById("f").target = "sink";
  document.getElementById("f").submit();
  window.results.push("form1");
}}
attack();
</script></body></html>"""


@pytest.fixture
def attacker(server: Any) -> Iterator[str]:
    """A page on another localhost port (another origin), aimed at the stepwatch server."""
    page = ATTACK.format(api=f"{server.url}/api/v1/namespaces/default").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_a_page_on_another_local_port_can_neither_stop_nor_create_a_job(page: Any, fleet: Any, attacker: str) -> None:
    fleet.register("train", total_steps=100)
    fleet.report("train", 5, {"loss": 1.0}, total_steps=100)
    page.goto(attacker)
    page.wait_for_function("() => window.results && window.results.includes('form1')")
    page.wait_for_timeout(500)  # the form's POST, into the hidden frame
    # the second form too (urlencoded), on its own navigation
    page.evaluate("() => { const g = document.getElementById('g'); g.target = 'sink'; g.submit(); }")
    page.wait_for_timeout(500)
    results = page.evaluate("() => window.results")
    # the JSON fetch is cross-origin: its preflight is refused, so it is never sent
    assert results[2].startswith("error:"), results
    job = fleet.job("train")
    assert job["attempt"] == 1 and job["state"] == "running", job
    assert job["pending_commands"] == [], job
    names = [j["name"] for j in fleet.http.get("/api/v1/jobs").json()["items"]]
    assert names == ["train"], names
    fleet.report("train", 6, {"loss": 0.9}, total_steps=100)  # the real job's next report is accepted
    page.problems.clear()  # the attacker page's own console is not the dashboard's


def test_the_dashboard_renders_its_list_and_charts_with_no_csp_violation(page: Any, fleet: Any) -> None:
    fleet.register("bert", total_steps=100)
    for step in range(1, 6):
        fleet.report("bert", step, {"loss": 1.0 / step}, total_steps=100)
    console: list[str] = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.add_init_script(
        "window.__csp = []; document.addEventListener('securitypolicyviolation', "
        "(e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    answer = page.goto(fleet.url + "/")
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    page.click("a.job-link:text-is('bert')")
    page.wait_for_selector("#panel h2:text-is('bert')")
    page.wait_for_function(
        "() => { const d = document.querySelector(\".chart[data-metric='loss']\"); "
        "return d && d.data && d.data.some((t) => t.y && t.y.length === 5); }"
    )
    page.goto(fleet.url + "/#/admin")
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__csp") == []
    assert not [line for line in console if "Content Security Policy" in line], console
