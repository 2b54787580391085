"""The quirky-S3 proxy itself (`tests/s3_quirks.py`): faithful without switches, and each switch
observable with plain boto3 against SeaweedFS behind it."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.fixtures_s3 import SeaweedServer
from tests.s3_quirks import FAITHFUL, QuirkyS3Proxy, StoreQuirks, decode_aws_chunked, operation_of

MIB = 1024 * 1024
Make = Callable[..., QuirkyS3Proxy]


@pytest.fixture
def quirky_s3(seaweed_server: SeaweedServer) -> Iterator[Make]:
    """``make(quirks=StoreQuirks(), **kwargs)``: a started proxy in front of the session's SeaweedFS
    (``QuirkyS3Proxy`` keyword arguments: ``clock``, ``seed``); all are stopped after the test."""
    made: list[QuirkyS3Proxy] = []

    def make(quirks: StoreQuirks = FAITHFUL, **kwargs: Any) -> QuirkyS3Proxy:
        proxy = QuirkyS3Proxy(seaweed_server.endpoint, quirks, **kwargs).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


def plain_client(endpoint: str, *, attempts: int = 3, checksums: str = "when_supported") -> Any:
    """boto3 as a user builds it (path-style for a custom endpoint, standard retries)."""
    config = Config(
        s3={"addressing_style": "path"},
        retries={"mode": "standard", "total_max_attempts": attempts},
        request_checksum_calculation=checksums,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def new_bucket(seaweed: SeaweedServer) -> str:
    bucket = f"qk-{uuid.uuid4().hex[:20]}"
    plain_client(seaweed.endpoint).create_bucket(Bucket=bucket)
    return bucket


def b64sha(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def error_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response: dict[str, Any] = exc.value.response
    return str(response["Error"]["Code"]), int(response["ResponseMetadata"]["HTTPStatusCode"])


def multipart(client: Any, bucket: str, key: str, data: bytes, **complete: Any) -> dict[str, Any]:
    """Two parts (5 MiB and the rest) with SHA-256 checksums, completed with ``complete`` parameters."""
    upload = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]
    parts = []
    for number, chunk in enumerate((data[: 5 * MIB], data[5 * MIB :]), start=1):
        answer = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk, ChecksumSHA256=b64sha(chunk)
        )
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        if "ChecksumSHA256" in answer:
            part["ChecksumSHA256"] = answer["ChecksumSHA256"]
        parts.append(part)
    result: dict[str, Any] = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, **complete
    )
    return result


def test_operation_names_of_path_style_requests() -> None:
    cases = [
        ("PUT", "b", "k", {}, {}, "PutObject"),
        ("PUT", "b", "k", {}, {"x-amz-copy-source": "b/j"}, "CopyObject"),
        ("PUT", "b", "k", {"partNumber": "1", "uploadId": "u"}, {}, "UploadPart"),
        ("POST", "b", "k", {"uploads": ""}, {}, "CreateMultipartUpload"),
        ("POST", "b", "k", {"uploadId": "u"}, {}, "CompleteMultipartUpload"),
        ("GET", "b", "k", {"uploadId": "u"}, {}, "ListParts"),
        ("DELETE", "b", "k", {"uploadId": "u"}, {}, "AbortMultipartUpload"),
        ("GET", "b", "", {"uploads": ""}, {}, "ListMultipartUploads"),
        ("GET", "b", "", {"list-type": "2"}, {}, "ListObjectsV2"),
        ("GET", "b", "", {"object-lock": ""}, {}, "GetObjectLockConfiguration"),
        ("PUT", "b", "k", {"tagging": ""}, {}, "PutObjectTagging"),
        ("PUT", "b", "k", {"legal-hold": ""}, {}, "PutObjectLegalHold"),
        ("GET", "b", "k", {"legal-hold": ""}, {}, "GetObjectLegalHold"),
        ("HEAD", "b", "k", {}, {}, "HeadObject"),
        ("PUT", "b", "", {}, {}, "CreateBucket"),
    ]
    assert [operation_of(*c[:5]) for c in cases] == [c[5] for c in cases]


def test_aws_chunked_bodies_decode_to_their_payload() -> None:
    body = b"5;chunk-signature=ab\r\nhello\r\n3\r\n, w\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    assert decode_aws_chunked(body) == b"hello, w"


def test_without_switches_the_proxy_forwards_faithfully(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """Checksums, metadata, create-once and multipart behave as SeaweedFS does; each accepted
    write is recorded once per key, and a refused one not at all."""
    proxy = quirky_s3()
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    put = client.put_object(
        Bucket=bucket, Key="a b/c", Body=b"hello", Metadata={"sha256": "x"}, ChecksumSHA256=b64sha(b"hello"),
        IfNoneMatch="*",
    )  # fmt: skip
    assert put["ETag"] == f'"{hashlib.md5(b"hello").hexdigest()}"'
    head = client.head_object(Bucket=bucket, Key="a b/c", ChecksumMode="ENABLED")
    assert (head["ChecksumSHA256"], head["Metadata"]) == (b64sha(b"hello"), {"sha256": "x"})
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=bucket, Key="a b/c", Body=b"other", IfNoneMatch="*")
    assert error_of(refused) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as bad_digest:
        client.put_object(Bucket=bucket, Key="forged", Body=b"other", ChecksumSHA256=b64sha(b"hello"))
    assert error_of(bad_digest)[1] == 400
    data = os.urandom(6 * MIB)
    done = multipart(client, bucket, "big", data, IfNoneMatch="*")
    assert done["ChecksumSHA256"].endswith("-2")
    assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == data
    assert client.get_object(Bucket=bucket, Key="a b/c")["Body"].read() == b"hello"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["a b/c", "big"]
    assert [(w.operation, w.key) for w in proxy.writes()] == [
        ("PutObject", "a b/c"),
        ("CompleteMultipartUpload", "big"),
    ]
    assert proxy.writes()[0].what == "sha256:" + hashlib.sha256(b"hello").hexdigest()
    assert proxy.overwrites() == {}
    assert proxy.requests()["PutObject"] == 3 and proxy.answered(412) == {"PutObject": 1}


def test_no_checksums_keeps_none_and_checks_none(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """The checksum headers never reach the server: a body not matching its checksum is stored, a
    HEAD or GET asking for the checksum gets none, multipart answers carry none. An object stored
    with one before the switch is answered without it too (a store that stops returning them)."""
    proxy = quirky_s3()
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    client.put_object(Bucket=bucket, Key="before", Body=b"kept", ChecksumSHA256=b64sha(b"kept"))
    assert "ChecksumSHA256" in client.head_object(Bucket=bucket, Key="before", ChecksumMode="ENABLED")
    proxy.quirks = StoreQuirks(no_checksums=True)
    client.put_object(Bucket=bucket, Key="forged", Body=b"other", ChecksumSHA256=b64sha(b"claimed"))
    assert client.get_object(Bucket=bucket, Key="forged")["Body"].read() == b"other"
    for key in ("before", "forged"):
        assert "ChecksumSHA256" not in client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert "ChecksumSHA256" not in client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    done = multipart(client, bucket, "big", os.urandom(6 * MIB))
    assert "ChecksumSHA256" not in done
    assert "ChecksumSHA256" not in client.head_object(Bucket=bucket, Key="big", ChecksumMode="ENABLED")


def test_drops_metadata_on_write_and_read(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    proxy = quirky_s3()
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    client.put_object(Bucket=bucket, Key="before", Body=b"x", Metadata={"sha256": "kept"})
    proxy.quirks = StoreQuirks(drops_metadata=True)
    client.put_object(Bucket=bucket, Key="after", Body=b"x", Metadata={"sha256": "dropped"})
    assert client.head_object(Bucket=bucket, Key="after")["Metadata"] == {}
    assert client.head_object(Bucket=bucket, Key="before")["Metadata"] == {}
    proxy.quirks = StoreQuirks()
    assert client.head_object(Bucket=bucket, Key="after")["Metadata"] == {}  # never stored
    assert client.head_object(Bucket=bucket, Key="before")["Metadata"] == {"sha256": "kept"}


def test_ignoring_if_none_match_lets_a_second_write_overwrite(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """PutObject and CompleteMultipartUpload with If-None-Match: * replace an existing object, and
    the proxy reports each such key with both writes."""
    proxy = quirky_s3(StoreQuirks(ignores_if_none_match=True))
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    client.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    client.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"second"
    client.put_object(Bucket=bucket, Key="big", Body=b"small first", IfNoneMatch="*")
    data = os.urandom(6 * MIB)
    multipart(client, bucket, "big", data, IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == data
    client.put_object(Bucket=bucket, Key="same", Body=b"same", IfNoneMatch="*")
    client.put_object(Bucket=bucket, Key="same", Body=b"same", IfNoneMatch="*")
    overwritten = proxy.overwrites()
    assert set(overwritten) == {f"{bucket}/k", f"{bucket}/big"}
    assert overwritten[f"{bucket}/k"] == [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in (b"first", b"second")]
    assert len(proxy.writes("same")) == 2  # written twice, the same bytes: not an overwrite


def test_optional_calls_answer_501_not_implemented(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    proxy = quirky_s3(StoreQuirks(optional_calls_501=True))
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    client.put_object(Bucket=bucket, Key="k", Body=b"x")
    calls = {
        "ListMultipartUploads": lambda: client.list_multipart_uploads(Bucket=bucket),
        "GetObjectLockConfiguration": lambda: client.get_object_lock_configuration(Bucket=bucket),
        "PutObjectTagging": lambda: client.put_object_tagging(
            Bucket=bucket, Key="k", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}
        ),
        "PutObjectLegalHold": lambda: client.put_object_legal_hold(Bucket=bucket, Key="k", LegalHold={"Status": "ON"}),
        "GetObjectLegalHold": lambda: client.get_object_legal_hold(Bucket=bucket, Key="k"),
    }
    for name, call in calls.items():
        with pytest.raises(ClientError) as exc:
            call()
        assert error_of(exc) == ("NotImplemented", 501), name
    assert proxy.answered(501) == dict.fromkeys(calls, 1)
    proxy.quirks = StoreQuirks()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # SeaweedFS has it


def test_crc32_and_aws_chunked_request_checksums_are_refused(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """botocore's default CRC32 header is refused with 400 InvalidArgument (B2's "Unsupported
    header"), as is an aws-chunked body; SHA-256 checksums and plain (when_required) requests pass."""
    proxy = quirky_s3(StoreQuirks(rejects_crc32=True))
    bucket = new_bucket(seaweed_server)
    default = plain_client(proxy.endpoint)
    with pytest.raises(ClientError) as exc:
        default.put_object(Bucket=bucket, Key="crc", Body=b"x")
    assert error_of(exc) == ("InvalidArgument", 400)
    assert "Unsupported header 'x-amz-checksum-crc32'" in str(exc.value)
    default.put_object(Bucket=bucket, Key="sha", Body=b"x", ChecksumSHA256=b64sha(b"x"))
    plain_client(proxy.endpoint, checksums="when_required").put_object(Bucket=bucket, Key="plain", Body=b"x")
    host, port = proxy.endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = b"1\r\nx\r\n0\r\n\r\n"
    conn.request("PUT", f"/{bucket}/chunked", body=body, headers={"Content-Encoding": "aws-chunked"})
    answer = conn.getresponse()
    assert answer.status == 400 and b"InvalidArgument" in answer.read()
    conn.close()
    assert {w.key for w in proxy.writes()} == {"sha", "plain"}


@pytest.mark.parametrize(
    ("quirks", "shape"),
    [
        (StoreQuirks(etag_unquoted=True), lambda md5: md5),
        (StoreQuirks(etag_upper=True), lambda md5: f'"{md5.upper()}"'),
        (StoreQuirks(etag_unquoted=True, etag_upper=True), lambda md5: md5.upper()),
    ],
    ids=["unquoted", "upper", "both"],
)
def test_etags_come_unquoted_or_upper_cased_and_are_taken_back_so(
    quirky_s3: Make, seaweed_server: SeaweedServer, quirks: StoreQuirks, shape: Callable[[str], str]
) -> None:
    proxy = quirky_s3(quirks)
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    md5 = hashlib.md5(b"hello").hexdigest()
    assert client.put_object(Bucket=bucket, Key="k", Body=b"hello")["ETag"] == shape(md5)
    assert client.head_object(Bucket=bucket, Key="k")["ETag"] == shape(md5)
    assert client.get_object(Bucket=bucket, Key="k")["ETag"] == shape(md5)
    assert client.list_objects_v2(Bucket=bucket)["Contents"][0]["ETag"] == shape(md5)
    data = os.urandom(6 * MIB)
    done = multipart(client, bucket, "big", data)  # completed with the ETags as answered
    assert done["ETag"] == shape(done["ETag"].strip('"').lower())
    assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == data


def test_listings_come_in_another_order_than_s3_byte_order(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """Each page holds the right keys, not sorted; following the pages still lists every key once."""
    proxy = quirky_s3(StoreQuirks(list_unordered=True))
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    names = [f"k{n:02d}" for n in range(30)]
    for name in names:
        client.put_object(Bucket=bucket, Key=name, Body=b"x")
    page = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(page) == names and page != names
    listed = []
    for part in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 10}):
        listed += [o["Key"] for o in part["Contents"]]
    assert sorted(listed) == names


def test_listings_lag_a_write_until_the_clock_moves_on(quirky_s3: Make, seaweed_server: SeaweedServer) -> None:
    """A key written less than `list_lag` seconds ago (the proxy's clock) is missing from listings,
    url-encoded or not, while HEAD and GET already see it."""
    now = [100.0]
    proxy = quirky_s3(StoreQuirks(list_lag=5.0), clock=lambda: now[0])
    client, bucket = plain_client(proxy.endpoint), new_bucket(seaweed_server)
    client.put_object(Bucket=bucket, Key="old", Body=b"x")
    now[0] += 5.0
    client.put_object(Bucket=bucket, Key="new &+ key", Body=b"y")

    def listed() -> list[str]:
        return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]

    assert listed() == ["old"]
    assert client.list_objects_v2(Bucket=bucket, EncodingType="url")["KeyCount"] == 1
    assert client.head_object(Bucket=bucket, Key="new &+ key")["ContentLength"] == 1
    now[0] += 4.9
    assert listed() == ["old"]
    now[0] += 0.1
    assert listed() == ["new &+ key", "old"]


def test_slowdown_bursts_answer_503_with_retry_after_and_standard_retries_get_through(
    quirky_s3: Make, seaweed_server: SeaweedServer
) -> None:
    proxy = quirky_s3(StoreQuirks(slowdown_every=4, slowdown_burst=1))
    bucket = new_bucket(seaweed_server)
    once = plain_client(proxy.endpoint, attempts=1)
    answers = []
    for n in range(4):
        try:
            once.head_bucket(Bucket=bucket)
            answers.append(200)
        except ClientError as exc:
            answers.append(exc.response["ResponseMetadata"]["HTTPStatusCode"])
            assert exc.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "1", n
    assert answers == [200, 200, 200, 503]
    with pytest.raises(ClientError) as exc:
        for _ in range(4):
            once.list_objects_v2(Bucket=bucket)
    assert error_of(exc) == ("SlowDown", 503)
    retrying = plain_client(proxy.endpoint, attempts=3)
    for n in range(8):
        retrying.put_object(Bucket=bucket, Key=f"k{n}", Body=b"x")
    assert len(proxy.writes()) == 8 and proxy.answered(503)["PutObject"] == 2
