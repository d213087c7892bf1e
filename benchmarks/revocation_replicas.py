"""Revocation across PostgreSQL replicas: is a revoked API token refused by the other replica at once?

Two stepwatch servers (``--auth tokens``) on one PostgreSQL schema, each a real uvicorn on its own
loopback socket. Each round makes a viewer token, uses it on replica B (so that B has seen it), revokes
it through replica A, and, as soon as A's answer is read, asks B with it. A round in which B still
answers 200 is a revocation that did not hold "at once". Also timed: the revocation itself (A's
answer) and a read on B with a valid token (median), since B checking the database costs a round trip.

    .venv/bin/python benchmarks/revocation_replicas.py [--rounds 80] [--url postgresql://root@127.0.0.1/test]

Run the same script with ``PYTHONPATH=<a checkout of the code before>/src`` for the baseline. Needs a
PostgreSQL server (the tests' one by default); the schema it makes is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx
import psycopg

import stepwatch
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.api.auth import hash_token, mint_token
from stepwatch.server.store import AuditEntry
from stepwatch.server.store.postgres import PostgresStore
from stepwatch.testing.server import ServerThread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--url", default="postgresql://root@127.0.0.1/test")
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin_conn = psycopg.connect(args.url, autocommit=True)
    admin_conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{args.url}?options=-csearch_path%3D{schema}"
    try:
        run(url, args.rounds)
    finally:
        admin_conn.execute(f"DROP SCHEMA {schema} CASCADE")
        admin_conn.close()


def run(url: str, rounds: int) -> None:
    seed = PostgresStore(url)
    token, admin = mint_token("admin", ("*",), "root", time.time())
    seed.create_token(token, hash_token(admin), AuditEntry(time.time(), "bench", "token_created"))
    seed.close()
    settings = ServerSettings(auth="tokens")
    a = ServerThread(create_app(settings, store=PostgresStore(url))).start()
    b = ServerThread(create_app(settings, store=PostgresStore(url))).start()
    accepted = 0
    revoke_ms: list[float] = []
    read_ms: list[float] = []
    try:
        with httpx.Client(base_url=a.url, timeout=10) as on_a, httpx.Client(base_url=b.url, timeout=10) as on_b:
            on_a.headers["Authorization"] = f"Bearer {admin}"
            for i in range(rounds):
                made = on_a.post("/api/v1/tokens", json={"role": "viewer", "namespaces": ["*"], "name": f"t{i}"})
                made.raise_for_status()
                secret, token_id = made.json()["secret"], made.json()["token"]["id"]
                viewer = {"Authorization": f"Bearer {secret}"}
                for _ in range(3):  # B has seen the token (and may keep it in memory)
                    started = time.perf_counter()
                    assert on_b.get("/api/v1/jobs", headers=viewer).status_code == 200
                    read_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                on_a.delete(f"/api/v1/tokens/{token_id}").raise_for_status()
                revoke_ms.append((time.perf_counter() - started) * 1000)
                if on_b.get("/api/v1/jobs", headers=viewer).status_code == 200:
                    accepted += 1
    finally:
        a.stop()
        b.stop()
        a.app.state.services.store.close()
        b.app.state.services.store.close()
    print(f"stepwatch {stepwatch.__version__} from {stepwatch.__file__}")
    print("| rounds | B accepted a token after A's revoke answered | revoke median / p95 | B read median |")
    print("|---|---|---|---|")
    p95 = sorted(revoke_ms)[int(0.95 * (len(revoke_ms) - 1))]
    print(
        f"| {rounds} | {accepted}/{rounds} | {statistics.median(revoke_ms):.2f} / {p95:.2f} ms "
        f"| {statistics.median(read_ms):.2f} ms |"
    )


if __name__ == "__main__":
    main()
