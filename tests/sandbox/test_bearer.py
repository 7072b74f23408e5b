"""sandbox/bearer.py: the one Bearer check of the ARM, Resource Graph and Event Hubs stand-ins."""

from __future__ import annotations

import base64
import json

from sandbox.bearer import bearer_problem
from sandbox.eventhubs.rest import token_problem
from sandbox.imds.arm import arm_token_problem

ARM = ("https://management.azure.com", "https://management.core.windows.net")


def jwt(claims: object) -> str:
    part = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"Bearer e30.{part}.sig"


def test_audience_and_expiry_decide() -> None:
    assert bearer_problem(jwt({"aud": "https://management.azure.com/", "exp": 200}), ARM, "ARM", 100) == ""
    assert bearer_problem(jwt({"aud": "HTTPS://MANAGEMENT.AZURE.COM", "exp": 200}), ARM, "ARM", 100) == ""
    assert bearer_problem(jwt({"aud": "https://storage.azure.com/", "exp": 200}), ARM, "ARM", 100) == \
        "InvalidAudience: the token's audience 'https://storage.azure.com/' is not ARM's"
    expired = bearer_problem(jwt({"aud": ARM[0], "exp": 100}), ARM, "ARM", 100)
    assert expired == "ExpiredToken: the token has expired"
    assert bearer_problem(jwt({"aud": ARM[0], "exp": "200"}), ARM, "ARM", 100).startswith("ExpiredToken")
    assert bearer_problem(jwt({"aud": ARM[0]}), ARM, "ARM", 100).startswith("ExpiredToken")


def test_what_is_not_a_bearer_jwt() -> None:
    assert bearer_problem("", ARM, "ARM") == "a Bearer token is required"
    assert bearer_problem("Basic dXNlcjpwdw==", ARM, "ARM") == "a Bearer token is required"
    assert bearer_problem("Bearer a.%%%.c", ARM, "ARM") == "the Bearer token is not a JWT"
    assert bearer_problem(jwt([1, 2]), ARM, "ARM") == "the Bearer token is not a JWT"


def test_the_stand_ins_use_it() -> None:
    live = jwt({"aud": "https://management.azure.com/", "exp": 4_000_000_000})
    assert arm_token_problem(live) == ""
    assert arm_token_problem(jwt({"aud": "https://eventhubs.azure.net", "exp": 4_000_000_000})).startswith(
        "InvalidAudience")
    assert token_problem(jwt({"aud": "https://eventhubs.azure.net", "exp": 200}), 100) == ""
    assert token_problem("SharedAccessSignature sr=x&sig=y&se=1&skn=z", 100) == ""  # keys: its own rule
