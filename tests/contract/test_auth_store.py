"""The users-and-tokens part of the metadata store contract (``AuthStore``), on SQLite and on
PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from shoal.core.auth import Scope, hash_token, new_token
from shoal.core.ports import AuthStore
from shoal.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from shoal.storage.sql import SqlMetadataStore


@pytest.fixture
def store(db_url: str) -> Iterator[SqlMetadataStore]:
    s = SqlMetadataStore.open(db_url, create=True)
    try:
        yield s
    finally:
        try:
            s.delete_all()
        finally:
            s.close()


def test_users_and_tokens_round_trip_and_only_the_hash_is_kept(store: SqlMetadataStore) -> None:
    assert isinstance(store, AuthStore)
    user = f"u{uuid.uuid4().hex[:8]}"
    assert store.create_user(user).is_admin is False
    with pytest.raises(AlreadyExistsError, match=user):
        store.create_user(user)
    token = new_token()
    expires = datetime.now(UTC) + timedelta(days=1)
    made = store.create_token(user, "laptop", scope=Scope.WRITE, token_hash=hash_token(token),
                              expires_at=expires)
    found = store.token_by_hash(hash_token(token))
    assert found == made and found.scope is Scope.WRITE and found.usable_at(datetime.now(UTC))
    assert abs((found.expires_at or expires) - expires) < timedelta(seconds=1)
    assert store.token_by_hash(hash_token(new_token())) is None
    assert [t.name for t in store.list_tokens(user)] == ["laptop"]
    with pytest.raises(AlreadyExistsError, match="laptop"):
        store.create_token(user, "laptop", scope=Scope.READ, token_hash=hash_token(new_token()))
    revoked = store.revoke_token(made.id)
    assert revoked.revoked_at is not None and not revoked.usable_at(datetime.now(UTC))
    assert store.revoke_token(made.id).revoked_at == revoked.revoked_at  # idempotent


def test_tokens_of_unknown_users_admin_scopes_and_unknown_ids_are_refused(
        store: SqlMetadataStore) -> None:
    with pytest.raises(NotFoundError, match="'nobody'"):
        store.create_token("nobody", "t", scope=Scope.READ, token_hash=hash_token(new_token()))
    user = f"u{uuid.uuid4().hex[:8]}"
    store.create_user(user)
    with pytest.raises(InvalidArgumentError, match="not an admin"):
        store.create_token(user, "t", scope=Scope.ADMIN, token_hash=hash_token(new_token()))
    with pytest.raises(NotFoundError, match="'no-such-id'"):
        store.revoke_token("no-such-id")
    with pytest.raises(InvalidArgumentError, match="not valid"):
        store.create_user("bad name/with slash")
