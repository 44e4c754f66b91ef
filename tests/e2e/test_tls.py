"""`serve --ssl-certfile/--ssl-keyfile`: the shim speaks HTTPS, and the OpenAI SDK, trusting only that
certificate, gets its answers; a client that trusts the system's authorities refuses the throwaway one."""

from __future__ import annotations

import ssl
import subprocess

import httpx
import openai
import pytest

from .conftest import running_serve


def test_the_sdk_talks_to_the_shim_over_https(tiny_model_dir, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    flags = ("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    with running_serve(tiny_model_dir, tmp_path, *flags, scheme="https", verify=cert) as ports:
        base = f"https://127.0.0.1:{ports['--shim-port']}/v1"
        with httpx.Client(verify=ssl.create_default_context(cafile=cert)) as trusting:
            client = openai.OpenAI(base_url=base, api_key="unused", http_client=trusting)
            completion = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
            assert completion.usage.completion_tokens == 4
            stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0, stream=True)
            chunks = list(stream)
            assert "".join(c.choices[0].text for c in chunks if c.choices) == completion.choices[0].text
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{base}/models")  # the system's authorities do not know it
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"http://127.0.0.1:{ports['--shim-port']}/health")  # no plain HTTP beside it
