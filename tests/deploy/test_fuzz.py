"""Property-based fuzzing of the OpenAPI schema (schemathesis) against a real server process.

Every operation gets up to 200 schema-valid and 200 schema-invalid generated cases (over 1,000 in
all, counted and asserted): no 5xx,
responses conform to the documented schemas (errors in the one JSON error shape), and no stack
trace or internal path leaks into any response.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.schemas import APIOperation

from tests.deploy.conftest import Process

LEAKS = ("Traceback", 'File "/', "site-packages", "/work/", "/usr/lib/python")


def fuzz(
    operation: APIOperation[Any, Any, Any, Any],
    mode: GenerationMode,
    cases: Counter[str],
    statuses: Counter[int],
    conform: bool = True,
    examples: int = 80,
) -> None:
    """Generated cases of ``operation``: no 5xx, no leak, and (``conform``) responses as the
    document describes them. The dialects' documents do not describe their APIs' own error
    shapes: their responses are not checked against them."""
    label = f"{operation.label} ({mode.value})"

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: schemathesis.Case[Any]) -> None:
        response = case.call(timeout=60)
        cases[label] += 1
        statuses[response.status_code] += 1
        assert response.status_code < 500, (label, response.status_code, response.text)
        if conform:
            # Semantic limits (language codes, token counts) are not in the schema, so a
            # schema-valid request may rightly get 422: positive_data_acceptance does not apply.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])
        for leak in LEAKS:
            assert leak not in response.text, (label, response.text)

    try:
        check()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE  # an operation without inputs has no bad input


def test_the_api_never_fails_on_generated_input(service: Process) -> None:
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    cases: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(result.ok(), mode, cases, statuses)  # type: ignore[union-attr]
    print(f"\nschemathesis: {sum(cases.values())} cases {dict(cases)}; statuses {dict(statuses)}")
    assert sum(cases.values()) >= 1000


# The dialects whose routes read their own bodies, each with its OpenAPI document (the bodies
# documented from the routes' typed models): Google v2, Google v3, DeepL's v3 glossaries.
DIALECT_DOCUMENTS = ("/language/translate", "/v3/projects", "/v3")


def test_the_new_dialects_never_fail_on_generated_input(service: Process) -> None:
    """Issue 38: schemathesis over Google's and DeepL v3's documents: no 5xx, no leak."""
    cases: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    for prefix in DIALECT_DOCUMENTS:
        schema = schemathesis.openapi.from_url(f"{service.url}{prefix}/openapi.json")
        for result in schema.get_all_operations():
            operation = result.ok()  # type: ignore[union-attr]
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz(operation, mode, cases, statuses, conform=False, examples=40)
    print(f"\nschemathesis (dialects): {sum(cases.values())} cases; statuses {dict(statuses)}")
    assert sum(cases.values()) >= 500
