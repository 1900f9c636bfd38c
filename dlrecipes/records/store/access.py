"""Whether a bucket can be used, asked once before anything is built or written: wrong credentials, a missing
bucket or an endpoint that does not answer are one line within seconds (an S3 bucket asked by boto3 alone, with
short timeouts; another scheme's listed through Composer's object-store layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrecipes.errors import UserError, first_line
from dlrecipes.records.store.bucket import object_store

if TYPE_CHECKING:
    from dlrecipes.records.store.bucket import RemoteRoot

READ_TIMEOUT = 5.0  # seconds the first question to a bucket waits for its answer


def check_access(root: RemoteRoot, key_path: str = "runs_dir") -> None:
    """Ask the bucket (a few seconds at most): one line when the credentials, the bucket or the endpoint are wrong,
    before anything is built or written. Its callers ask once per command: a run store when first used
    (:meth:`~.objects.BucketStore.check`), a read of a run, a dataset's bucket."""
    if root.scheme == "s3":
        _ask_s3(root, key_path)
    else:  # through Composer's store: a listing answers whether the bucket can be read with what this machine has
        try:
            object_store(root, key_path).keys(root.key("") + "/" if root.prefix else "")
        except UserError:
            raise
        except Exception as exc:
            first = first_line(exc, 200, "")
            raise UserError(f"{key_path}: {root}: the bucket cannot be read: {type(exc).__name__}: {first}") from None


def _ask_s3(root: RemoteRoot, key_path: str) -> None:
    """boto3 alone (no Composer import), one attempt with short timeouts: the answer comes in seconds."""
    import botocore.exceptions

    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise UserError(f"{key_path}: {root} needs boto3: pip install 'dlrecipes[s3]' ({exc})") from None
    from dlrecipes.records.store.backend import endpoint as endpoint_url

    given = endpoint_url()  # one line when S3_ENDPOINT_URL is no address
    endpoint = given or "AWS's default endpoint"
    try:  # boto3 alone (no Composer import): the answer comes in seconds
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=given,
            config=Config(
                retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=3, read_timeout=READ_TIMEOUT
            ),
        )
        client.head_bucket(Bucket=root.bucket)
    except botocore.exceptions.NoCredentialsError:
        raise UserError(
            f"{key_path}: {root}: no S3 credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE)"
        ) from None
    except botocore.exceptions.ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket"):
            raise UserError(
                f"{key_path}: {root}: bucket '{root.bucket}' does not exist at {endpoint} (create it first)"
            ) from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise UserError(
                f"{key_path}: {root}: access denied at {endpoint} with the credentials found (check "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ) from None
        raise UserError(f"{key_path}: {root}: {exc}") from None
    except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError) as exc:
        raise UserError(
            f"{key_path}: {root}: cannot reach the S3 endpoint {endpoint} (S3_ENDPOINT_URL): {type(exc).__name__}"
        ) from None
    except (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectionClosedError) as exc:
        raise UserError(
            f"{key_path}: {root}: the S3 endpoint {endpoint} (S3_ENDPOINT_URL) accepted the connection "
            f"but did not answer within {READ_TIMEOUT:g} s ({type(exc).__name__}); check that the server is "
            "up and answering"
        ) from None
