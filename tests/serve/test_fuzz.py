"""The server's OpenAPI schema, fuzzed by schemathesis (the way vLLM fuzzes its OpenAI server): every
generated request, valid or not, gets an answer below 500, in time, and in OpenAI's error shape when it
is refused."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from test_serve import TEXT, serving  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def openapi(serving):  # noqa: F811
    url, _ = serving(TEXT)
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


schema = schemathesis.pytest.from_fixture("openapi")


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_generated_request_gets_a_500_or_hangs(case):
    response = case.call(timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path} {case.body!r:.300} -> {response.text[:500]}"
    if response.status_code >= 400:
        assert set(response.json()) == {"error"}, response.text[:300]
