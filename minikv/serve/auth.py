"""Bearer API keys -> tenants. The tenant a request runs as comes from its key, never its body."""

from __future__ import annotations

from http import HTTPStatus

from minikv.serve.errors import APIError

ANONYMOUS = "anon"  # every caller's tenant when the server was started without keys


def parse_api_keys(specs: list[str]) -> dict[str, str]:
    """`TENANT=KEY` strings -> {key: tenant}; ValueError naming the bad one."""
    keys: dict[str, str] = {}
    for spec in specs:
        tenant, sep, key = spec.partition("=")
        if not sep or not tenant or not key:
            raise ValueError(f"--api-key wants TENANT=KEY, got {spec.split('=')[0]!r}=...")
        if key in keys:
            raise ValueError(f"the same key is given to tenants {keys[key]!r} and {tenant!r}")
        keys[key] = tenant
    return keys


def tenant_for(authorization: str | None, keys: dict[str, str]) -> str:
    """The tenant this Authorization header belongs to, or a 401 in OpenAI's shape."""
    if not keys:
        return ANONYMOUS
    if not authorization:
        raise APIError(HTTPStatus.UNAUTHORIZED, "missing API key: send 'Authorization: Bearer <key>'",
                       "invalid_api_key", kind="authentication_error")
    scheme, _, key = authorization.partition(" ")
    tenant = keys.get(key.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise APIError(HTTPStatus.UNAUTHORIZED, "incorrect API key provided", "invalid_api_key",
                       kind="authentication_error")
    return tenant
