"""Issue 21's attacks on a local server (items 1, 4, 6, 7, 9, 10), each played once; prints what the server did.

    .venv/bin/python benchmarks/web_attacks.py                                # the code of this checkout
    PYTHONPATH=<a checkout of the code before>/src .venv/bin/python benchmarks/web_attacks.py   # the baseline

Real servers (uvicorn on loopback, ``stepwatch.testing.server.LocalServer``) on fresh SQLite files.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import httpx

import stepwatch
from stepwatch.server.api.auth import hash_token
from stepwatch.server.store import SQLiteStore
from stepwatch.testing.server import LocalServer

JOBS = "/api/v1/namespaces/default/jobs"


def main() -> None:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "data"
        db = where / "sw.db"
        server = LocalServer(db).start()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            http.post(JOBS, json={"name": "train"})
            got = http.get(f"{JOBS}/train", headers={"Host": "attacker.example"})
            rows.append(("1 GET a job with Host: attacker.example", str(got.status_code)))
            forged = http.post(
                JOBS, content=b'{"name":"train","supersede":true}', headers={"Content-Type": "text/plain"}
            )
            attempt = http.get(f"{JOBS}/train").json()["attempt"]
            rows.append(
                ("1 text/plain POST supersede (a cross-site form)", f"{forged.status_code}, attempt now {attempt}")
            )
            stop = http.post(f"{JOBS}/train/commands", json={"kind": "stop"}, headers={"Origin": "http://localhost:1"})
            rows.append(("1 JSON stop with Origin http://localhost:1", str(stop.status_code)))
            page = http.get("/")
            names = ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy")
            rows.append(("7 security headers on the dashboard page", f"{sum(n in page.headers for n in names)}/4"))
            policy = http.put("/api/v1/namespaces/default/policy", json={"notify": ["http://127.0.0.1:9/steal"]})
            rows.append(("4 policy target http://127.0.0.1:9 (loopback)", str(policy.status_code)))
            metadata = http.put("/api/v1/namespaces/default/policy", json={"notify": ["http://169.254.169.254/x"]})
            rows.append(("4 policy target http://169.254.169.254 (metadata)", str(metadata.status_code)))
            minted = http.post("/api/v1/tokens", json={"role": "admin", "namespaces": ["*"], "name": "drive-by"})
            secret = minted.json().get("secret") if minted.status_code == 201 else None
            rows.append(("10 mint an admin token without auth", str(minted.status_code)))
        server.stop()
        modes = [
            f"{stat.S_IMODE(os.stat(f'{db}{s}').st_mode):o}" for s in ("", "-wal", "-shm") if os.path.exists(f"{db}{s}")
        ]
        rows.append(
            ("9 database, -wal, -shm / new directory", f"{' '.join(modes)} / {stat.S_IMODE(where.stat().st_mode):o}")
        )
        store = SQLiteStore(db)
        store.register("default", "exists", token_hash=hash_token("t"), now=time.time())
        store.close()
        with LocalServer(db, auth="tokens") as secured, httpx.Client(base_url=secured.url, timeout=10) as http:
            if secret:
                reused = http.get("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"})
                rows.append(("10 that token after a restart with --auth tokens", str(reused.status_code)))
            else:
                rows.append(("10 that token after a restart with --auth tokens", "none was made"))
            answers = [
                http.post(f"{JOBS}/{name}/state", json={"state": "failed"}).status_code
                for name in ("exists", "missing")
            ]
            rows.append(
                ("6 no-token write to an existing / a missing job (auth tokens)", " / ".join(map(str, answers)))
            )
    print(f"stepwatch from {stepwatch.__file__}")
    print("| attack | answer |\n|---|---|")
    for attack, answer in rows:
        print(f"| {attack} | {answer} |")


if __name__ == "__main__":
    main()
