import pytest


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    yield
