"""The checkers of notebooks 08 and 10 are strict: the type asked for, the server's and the probe's own rules."""

from __future__ import annotations

import pytest

from minikv.exercises.nb08_detection import check_unreviewable
from minikv.exercises.nb11_over_http import check_holds_canary, check_tenant_of


def unreviewable(affected):
    return {r.request_id for r in affected if r.status == 200 and not r.response_text}


def test_unreviewable_checker_accepts_a_set(capsys):
    """The right ids, as a set: passes."""
    check_unreviewable(unreviewable)
    assert "Correct" in capsys.readouterr().out


def test_unreviewable_checker_rejects_the_right_ids_as_a_list():
    """A list was asked for as a set: the same ids in a list are rejected, saying so."""
    with pytest.raises(AssertionError, match="expected a set of request ids, got list"):
        check_unreviewable(lambda affected: sorted(unreviewable(affected)))


def test_tenant_checker_accepts_the_bearer_key_and_rejects_trusting_the_header_blindly(capsys):
    """A key after "Bearer" (any case) names its tenant; taking a tenant's name from the header fails."""
    def tenant_of(authorization, keys):
        scheme, _, key = (authorization or "").partition(" ")
        return keys.get(key.strip()) if scheme.lower() == "bearer" else None
    check_tenant_of(tenant_of)
    assert "correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="'Bearer alice'"):
        check_tenant_of(lambda h, keys: tenant_of(h, keys) or next((t for t in keys.values() if h == f"Bearer {t}"), None))
    with pytest.raises(AssertionError, match="expected"):
        check_tenant_of(lambda h, keys: keys.get((h or "").removeprefix("Bearer ")))  # case and spaces matter


def test_canary_checker_wants_fragments_not_only_the_whole_canary():
    """`canary in text` misses the fragments a leak shows; a 7-character run is not a match."""
    check_holds_canary(lambda text, canary: any(canary[i:i + 8] in text for i in range(len(canary) - 7)))
    with pytest.raises(AssertionError, match="expected True"):
        check_holds_canary(lambda text, canary: canary in text)
    with pytest.raises(AssertionError, match="expected False"):
        check_holds_canary(lambda text, canary: any(canary[i:i + 7] in text for i in range(len(canary) - 6)))
