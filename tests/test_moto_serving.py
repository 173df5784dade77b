"""The S3 test server's listing (tests/moto_serving.py) answers exactly as moto's own."""

from __future__ import annotations

import operator
import random

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

from tests.moto_serving import _MOTO_LIST, list_objects_v2


def _names(answer) -> tuple[list[str], bool, str | None]:
    keys, truncated, token = answer
    return [k if isinstance(k, str) else k.name for k in keys], truncated, token


def both(backend, bucket, args: tuple) -> tuple:
    """The names, truncation and token of one listing, ours and moto's."""
    return _names(list_objects_v2(backend, bucket, *args)), _names(
        _MOTO_LIST(backend, bucket, *args)
    )


@pytest.mark.parametrize("seed,versioned", [(1, False), (2, True), (3, False)])
def test_listing_answers_as_moto_does(seed: int, versioned: bool, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    rng = random.Random(seed)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="listing")
        if versioned:  # a deletion leaves a delete marker as the key's latest version
            s3.put_bucket_versioning(
                Bucket="listing", VersioningConfiguration={"Status": "Enabled"}
            )
        parts = ["a", "a/b", "t/_delta_log", "t/x=1", "zz"]
        names = {f"{rng.choice(parts)}/{rng.randrange(300):020d}.json" for _ in range(400)}
        for name in names:
            s3.put_object(Bucket="listing", Key=name, Body=b"x")
        gone = rng.sample(sorted(names), 60)
        s3.delete_objects(Bucket="listing", Delete={"Objects": [{"Key": k} for k in gone]})
        for name in gone[:10]:  # written again after their deletion
            s3.put_object(Bucket="listing", Key=name, Body=b"y")
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        bucket = backend.get_bucket("listing")
        everything = sorted(n for n in names if n not in gone[10:])
        queries = [(None, None, 1000), ("", None, 7), ("t/", None, 1000), ("nothing", None, 5)]
        for _ in range(40):
            prefix = rng.choice([None, "a", "a/", "t/_delta_log/", "zz/0", ""])
            queries.append((prefix, rng.choice([None, *everything]), rng.choice([1, 3, 1000])))
        for prefix, start_after, max_keys in queries:
            args = (prefix, None, None, start_after, max_keys)
            ours, moto = both(backend, bucket, args)
            assert ours == moto, args
            if moto[2]:  # the next page, through the continuation token
                args = (prefix, None, moto[2], None, max_keys)
                assert operator.eq(*both(backend, bucket, args)), args
        listed = _names(list_objects_v2(backend, bucket, None, None, None, None, 1000))[0]
        assert listed == everything
        assert operator.eq(*both(backend, bucket, ("a", "/", None, None, 1000)))  # moto's own
