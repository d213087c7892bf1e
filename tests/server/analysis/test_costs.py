"""Cost: default prices from the server's settings, and totals per namespace and overall."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from stepwatch.server import ServerSettings, create_app
from stepwatch.server.analysis.cost import PriceList, parse_prices

MakeReport = Callable[..., dict[str, Any]]
pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize(
    ("namespace", "gpu_type", "price"),
    [
        ("nlp", "a100", 3.5),  # namespace/type
        ("nlp", "h100", 3.0),  # namespace
        ("vision", "h100", 4.1),  # type
        ("vision", "", 1.0),  # any type
        ("vision", "t4", 1.0),
    ],
)
def test_the_most_specific_price_wins(namespace: str, gpu_type: str, price: float) -> None:
    prices = PriceList(parse_prices("a100=2.5 h100=4.1 *=1"), parse_prices("nlp=3.0,nlp/a100=3.5"))
    assert prices.price(namespace, gpu_type) == price
    assert PriceList().price(namespace, gpu_type) == 0.0  # no entry: no price, the cost stays unknown


@pytest.mark.parametrize("text", ["a100", "a100=", "=2", "a100=-1", "a100=nan", "a100=inf", "a100=two"])
def test_a_bad_price_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="KEY=PRICE"):
        parse_prices(text)
    with pytest.raises(ValueError, match="STEPWATCH_GPU_PRICES"):
        ServerSettings.resolve({}, {"STEPWATCH_GPU_PRICES": text})


@pytest.fixture
def priced(database: Any, clock: Any) -> Iterator[TestClient]:
    settings = ServerSettings.resolve(
        {},
        {
            "STEPWATCH_GPU_PRICES": "a100=2.0",
            "STEPWATCH_NAMESPACE_PRICES": "research=1.5",
            "STEPWATCH_ALLOWED_HOSTS": "testserver",
        },
    )
    store = database.open()
    with TestClient(create_app(settings, store=store, clock=clock), raise_server_exceptions=False) as client:
        yield client


def _register(client: TestClient, namespace: str, name: str, **fields: Any) -> tuple[dict[str, Any], str]:
    made = client.post(f"/api/v1/namespaces/{namespace}/jobs", json={"name": name, **fields})
    assert made.status_code == 201, made.text
    return made.json()["job"], made.json()["token"]


def test_jobs_get_the_default_price_of_their_namespace_and_gpu(priced: TestClient) -> None:
    job, _ = _register(priced, "nlp", "ft", gpus=8, gpu_type="A100")
    assert job["resources"] == {"gpus": 8.0, "gpu_type": "a100", "gpu_hour_cost": 2.0}
    job, _ = _register(priced, "research", "probe", gpus=1, gpu_type="a100")
    assert job["resources"]["gpu_hour_cost"] == 1.5  # the namespace's price over the type's
    job, _ = _register(priced, "nlp", "own", gpus=2, gpu_type="a100", gpu_hour_cost=9.0)
    assert job["resources"]["gpu_hour_cost"] == 9.0  # a job's own price wins
    job, _ = _register(priced, "nlp", "unknown", gpus=2, gpu_type="t4")
    assert job["resources"]["gpu_hour_cost"] == 0.0 and job["cost"]["spent"] is None
    bad = priced.post("/api/v1/namespaces/nlp/jobs", json={"name": "x", "gpu_type": "\n"})
    assert bad.status_code == 422 and bad.json()["details"]["field"] == "gpu_type"


def test_totals_add_up_per_namespace_and_overall(priced: TestClient, clock: Any, make_report: MakeReport) -> None:
    def report(namespace: str, name: str, token: str, seq: int, step: int, loss: float, **more: Any) -> None:
        sent = priced.post(
            f"/api/v1/namespaces/{namespace}/jobs/{name}/reports",
            json=make_report(seq, step, {"loss": loss}, **more),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert sent.status_code == 200, sent.text

    _, a = _register(priced, "nlp", "a", gpus=4, gpu_type="a100")  # 8 $/h
    _, b = _register(priced, "research", "b", gpus=2, gpu_type="a100")  # 3 $/h
    _, c = _register(priced, "research", "c", gpus=1, gpu_type="a100")  # 1.5 $/h, ends early
    report("nlp", "a", a, 1, 1, 1.0)
    report("research", "b", b, 1, 1, 1.0)
    report("research", "c", c, 1, 1, 1.0)
    clock.advance(1800)
    report("research", "c", c, 2, 2, 0.5, state="finished")
    clock.advance(1800)
    report("nlp", "a", a, 2, 2, 0.9)
    report("research", "b", b, 2, 2, math.nan)
    found = priced.get("/api/v1/costs").json()
    research = found["namespaces"]["research"]
    assert found["namespaces"]["nlp"]["spent"] == pytest.approx(8.0)
    assert research["spent"] == pytest.approx(3.0 + 0.75)
    assert research["gpus_in_use"] == 2.0 and research["rate_per_hour"] == pytest.approx(3.0)  # c has ended
    assert found["total"]["spent"] == pytest.approx(8.0 + 3.75)
    assert found["total"]["rate_per_hour"] == pytest.approx(11.0) and found["total"]["jobs"] == 3
    assert found["total"]["spent"] == pytest.approx(sum(ns["spent"] for ns in found["namespaces"].values()))
    only = priced.get("/api/v1/costs", params={"namespace": "research", "since": clock.now - 60}).json()
    assert list(only["namespaces"]) == ["research"] and only["total"]["jobs"] == 1  # c ended before since
    assert priced.get("/api/v1/costs", params={"since": "soon"}).status_code == 400
