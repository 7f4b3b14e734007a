"""An object store's settings, from the catalog's ``s3.*`` properties and the standard AWS environment and profile.

Property names are pyiceberg's (``s3.endpoint``, ``s3.region``,
``s3.access-key-id``, ``s3.secret-access-key``, ``s3.session-token``,
``s3.force-virtual-addressing``). Whatever the properties leave out comes
from the environment (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``,
``AWS_REGION`` or ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), then from the profile
``AWS_PROFILE`` (or ``default``) of the shared credentials and config files.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

from lineage.errors import InvalidArgumentError

ENDPOINT = "s3.endpoint"
REGION = "s3.region"
ACCESS_KEY_ID = "s3.access-key-id"
SECRET_ACCESS_KEY = "s3.secret-access-key"
SESSION_TOKEN = "s3.session-token"
VIRTUAL_ADDRESSING = "s3.force-virtual-addressing"
PROPERTY_NAMES = (ENDPOINT, REGION, ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN, VIRTUAL_ADDRESSING)
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class StoreSettings:
    """How to reach an S3-compatible object store.

    ``endpoint`` is a URL (``http://127.0.0.1:9000``) or None for AWS itself;
    ``virtual_addressing`` False means path-style URLs (``endpoint/bucket/key``),
    what self-hosted stores (MinIO, moto, Ceph) need. Secrets never appear in
    ``repr`` or in any message.
    """

    endpoint: str | None = None
    region: str = DEFAULT_REGION
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    virtual_addressing: bool = False

    @property
    def scheme(self) -> str:
        """``http`` or ``https``: how the endpoint is reached."""
        if self.endpoint is None:
            return "https"
        return urlparse(self.endpoint).scheme or "https"

    @property
    def host(self) -> str | None:
        """The endpoint's ``host:port`` (None for AWS itself)."""
        if self.endpoint is None:
            return None
        parsed = urlparse(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
        return parsed.netloc or None

    def as_properties(self) -> dict[str, str]:
        """These settings as pyiceberg FileIO properties (to hand to a process that has no catalog)."""
        props = {REGION: self.region, VIRTUAL_ADDRESSING: str(self.virtual_addressing).lower()}
        for name, value in ((ENDPOINT, self.endpoint), (ACCESS_KEY_ID, self.access_key_id),
                            (SECRET_ACCESS_KEY, self.secret_access_key), (SESSION_TOKEN, self.session_token)):
            if value is not None:
                props[name] = value
        return props


def resolve(properties: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> StoreSettings:
    """The settings ``properties`` give, completed from the environment and then the AWS profile.

    Keys come as a pair: an access key from the properties is never matched
    with a secret from the environment. A ``s3.endpoint`` without a scheme
    reads as ``https://``.
    """
    props = dict(properties or {})
    env = os.environ if environ is None else environ
    profile = _profile(env)
    endpoint = props.get(ENDPOINT) or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or profile.get("endpoint_url")
    if endpoint is not None:
        endpoint = endpoint.strip().rstrip("/")
        if "://" not in endpoint:
            endpoint = f"https://{endpoint}"
        if urlparse(endpoint).scheme not in ("http", "https") or not urlparse(endpoint).netloc:
            raise InvalidArgumentError(f"{ENDPOINT} must be an http:// or https:// URL, got {endpoint!r}")
    region = props.get(REGION) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region") or DEFAULT_REGION
    if props.get(ACCESS_KEY_ID):
        keys = (props.get(ACCESS_KEY_ID), props.get(SECRET_ACCESS_KEY), props.get(SESSION_TOKEN))
    elif env.get("AWS_ACCESS_KEY_ID"):
        keys = (env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN"))
    else:
        keys = (profile.get("aws_access_key_id"), profile.get("aws_secret_access_key"), profile.get("aws_session_token"))
    if keys[0] and not keys[1]:
        raise InvalidArgumentError("an S3 access key id was given without its secret access key")
    virtual = str(props.get(VIRTUAL_ADDRESSING, "false")).strip().lower() in ("true", "1", "yes")
    return StoreSettings(endpoint, region, keys[0] or None, keys[1] or None, keys[2] or None, virtual)


def _profile(env: Mapping[str, str]) -> dict[str, str]:
    """The AWS profile's values (credentials file, then config file), or nothing when there is no such profile."""
    name = env.get("AWS_PROFILE") or "default"
    home = os.path.expanduser("~")
    out: dict[str, str] = {}
    sources = (
        (env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"), name if name == "default" else f"profile {name}"),
        (env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"), name),
    )
    for path, section in sources:  # credentials win over config: read last
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        if parser.has_section(section):
            out.update({k: v.strip() for k, v in parser.items(section)})
    return out
