"""The server's OpenAPI schema, fuzzed by schemathesis (the way vLLM fuzzes its OpenAI server): every
generated request, valid or not, gets an answer below 500, in time, and in OpenAI's error shape when it
is refused. (Driven through hypothesis directly: schemathesis's pytest fixture loader reads a private
pytest attribute that this pytest no longer has.)"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from test_serve import TEXT, serving  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow


def test_no_generated_request_gets_a_500_or_hangs(serving):  # noqa: F811
    url, _ = serving(TEXT)
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions"}
    for operation in operations:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(case=operation.as_strategy())
        def answers(case):
            response = case.call(base_url=url, timeout=60)
            where = f"{case.method} {case.path} {case.body!r:.300}"
            assert response.status_code < 500, f"{where} -> {response.text[:500]}"
            if response.status_code >= 400:
                assert set(response.json()) == {"error"}, f"{where} -> {response.text[:300]}"

        answers()
