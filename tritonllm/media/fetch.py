"""A media part's bytes, from wherever its reference points: a data URL (or bare base64, as the pages allow for
images), an http or https URL, or a file on the server. Every way is bounded: a URL by its connect and read
timeouts, its redirects and `allowed_domains`, its size while it downloads; a file by `allowed_local_path`, the
only folder a client may name (none by default), and by its size before it is read."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import httpx

from tritonllm.media.errors import MediaError
from tritonllm.media.kinds import MAX_IMAGE_PIXELS, MB, MediaKind

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?,(?P<payload>.*)", re.S
)
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG, PNG: what a bare base64 image must decode to
_PATH_MAX = 4096


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_path: Path | None = None  # server files only under it; None: clients may name none
    allowed_domains: frozenset[str] | None = None  # hosts a URL may name (each redirect's too); None: any
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_redirects: int = 3
    max_image_pixels: int = MAX_IMAGE_PIXELS  # an image's width x height at most, read before it is decoded


def fetch(reference: str, kind: MediaKind, part: str, policy: MediaPolicy) -> bytes:
    """The bytes `reference` names, at most `kind.max_bytes` of them; MediaError naming `part` otherwise."""
    if not isinstance(reference, str) or not reference.strip():
        raise MediaError(part, f"{part} must be a URL, a data URL or a server path")
    reference = reference.strip()
    scheme = urlsplit(reference).scheme.lower() if len(reference) < _PATH_MAX else ""
    if reference.startswith("data:"):
        return _data_url(reference, kind, part)
    if scheme in ("http", "https"):
        return _download(reference, kind, part, policy)
    if scheme == "file":
        return _local(Path(unquote(urlsplit(reference).path)), kind, part, policy)
    bare = _bare_base64(reference, kind, part) if kind.name == "image" else None
    if bare is not None:
        return _sized(bare, kind, part)
    if scheme:
        raise MediaError(part, f"{part}: {scheme}: URLs are not read (http, https, data or a server path)")
    return _local(Path(reference), kind, part, policy)


def _too_large(size: int, kind: MediaKind, part: str) -> MediaError:
    return MediaError(part, f"{part} is {size / MB:.1f} MB; a {kind.name} may be {kind.max_bytes // MB} MB")


def _sized(data: bytes, kind: MediaKind, part: str) -> bytes:
    if len(data) > kind.max_bytes:
        raise _too_large(len(data), kind, part)
    if not data:
        raise MediaError(part, f"{part} is empty")
    return data


def _data_url(reference: str, kind: MediaKind, part: str) -> bytes:
    match = _DATA_URL.fullmatch(reference)
    if match is None or not match.group("b64"):
        raise MediaError(part, f"{part}: a data URL must be data:<type>;base64,<data>")
    payload = match.group("payload")
    if len(payload) * 3 // 4 > kind.max_bytes + 3:  # refused before it is decoded
        raise MediaError(part, f"{part} is over {kind.max_bytes // MB} MB, the most a {kind.name} may be")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(part, f"{part}: the data URL's base64 does not decode ({e})") from e
    return _sized(data, kind, part)


def _bare_base64(reference: str, kind: MediaKind, part: str) -> bytes | None:
    """A base64 image given without a data URL, as the pages allow: only what decodes to a JPEG or PNG's first
    bytes counts, so a server path is never taken for one."""
    if len(reference) < 64 or not _BASE64.fullmatch(reference):
        return None
    try:
        head = base64.b64decode(reference[:64])
    except (binascii.Error, ValueError):
        return None
    if not head.startswith(_MAGIC):
        return None
    if len(reference) * 3 // 4 > kind.max_bytes + 3:
        raise _too_large(len(reference) * 3 // 4, kind, part)  # refused before it is decoded, as a data URL is
    try:
        return base64.b64decode(reference, validate=False)
    except (binascii.Error, ValueError):
        return None


def _download(url: str, kind: MediaKind, part: str, policy: MediaPolicy) -> bytes:
    timeout = httpx.Timeout(policy.read_timeout_s, connect=policy.connect_timeout_s)
    with httpx.Client(follow_redirects=False, timeout=timeout) as client:
        for _ in range(policy.max_redirects + 1):
            _check_host(url, part, policy)
            try:
                with client.stream("GET", url) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code != 200:
                        raise MediaError(part, f"{part}: {url} answered {response.status_code}")
                    declared = int(response.headers.get("content-length") or 0)
                    if declared > kind.max_bytes:
                        raise _too_large(declared, kind, part)
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > kind.max_bytes:  # enforced as it downloads, whatever the headers said
                            raise MediaError(part, f"{part}: {url} holds more than {kind.max_bytes // MB} MB")
                    return _sized(bytes(data), kind, part)
            except httpx.HTTPError as e:
                raise MediaError(part, f"{part}: {url} could not be read ({type(e).__name__}: {e})") from e
    raise MediaError(part, f"{part}: {url} redirects more than {policy.max_redirects} times")


def _check_host(url: str, part: str, policy: MediaPolicy) -> None:
    host = (urlsplit(url).hostname or "").lower()
    if not host:
        raise MediaError(part, f"{part}: {url} names no host")
    if policy.allowed_domains is not None and host not in policy.allowed_domains:
        raise MediaError(part, f"{part}: {host} is not among the media domains this server reads")


def _local(path: Path, kind: MediaKind, part: str, policy: MediaPolicy) -> bytes:
    root = policy.allowed_local_path
    if root is None:
        raise MediaError(part, f"{part}: this server reads no server paths (serve --allowed-local-media-path DIR)")
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise MediaError(part, f"{part}: no file {path} under the allowed media folder") from None
    if not resolved.is_relative_to(root.resolve()) or not resolved.is_file():
        raise MediaError(part, f"{part}: no file {path} under the allowed media folder")
    size = resolved.stat().st_size
    if size > kind.max_bytes:
        raise MediaError(part, f"{part} is {size / MB:.1f} MB; a {kind.name} may be {kind.max_bytes // MB} MB")
    return _sized(resolved.read_bytes(), kind, part)
