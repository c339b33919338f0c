"""The console's pure parts: the min/max thinning of metric series, the signed session
cookie and CSRF token, and the masking of secrets in a job's spec."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shoal.console._app import local_path
from shoal.console._endpoints import load_of
from shoal.console._render import masked, seconds
from shoal.console._runs import select_runs
from shoal.console._session import Sessions
from shoal.core.auth import Scope
from shoal.core.downsample import minmax_buckets, on_shared_x
from shoal.core.experiments import RunRecord, RunStatus
from shoal.errors import AuthenticationError, InvalidArgumentError
from shoal.server.admin import create_token
from shoal.storage.sql import SqlMetadataStore

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
SECRET = b"s" * 32


def test_a_short_series_is_sent_as_it_is() -> None:
    xs, ys = [0.0, 1.0, 2.0], [3.0, 1.0, 2.0]
    assert minmax_buckets(xs, ys, 2) == (xs, ys)


def test_thinning_keeps_each_buckets_extremes_in_order_so_a_spike_shows() -> None:
    n = 100_000
    xs = [float(i) for i in range(n)]
    ys = [math.sin(i / 500) for i in range(n)]
    ys[31_337] = 50.0  # one spike
    ys[77_777] = -50.0
    out_x, out_y = minmax_buckets(xs, ys, 400)
    assert len(out_x) == len(out_y) <= 800
    assert out_x == sorted(out_x) and len(set(out_x)) == len(out_x)
    assert (31_337.0, 50.0) in zip(out_x, out_y, strict=True)
    assert (77_777.0, -50.0) in zip(out_x, out_y, strict=True)
    assert all(ys[int(x)] == y for x, y in zip(out_x, out_y, strict=True))  # real points only


def test_a_bucket_of_only_nan_keeps_one_point_as_a_gap() -> None:
    xs = [float(i) for i in range(10)]
    ys = [float("nan")] * 5 + [1.0, 2.0, 3.0, 4.0, 5.0]
    out_x, out_y = minmax_buckets(xs, ys, 2)
    assert out_x[0] == 0.0 and math.isnan(out_y[0])
    assert (out_x[1:], out_y[1:]) == ([5.0, 9.0], [1.0, 5.0])


def test_few_points_of_several_series_share_their_exact_x_values() -> None:
    x, ys = on_shared_x([([0, 2, 3], [1.0, 2.0, 3.0]), ([1, 3], [5.0, None])], 10)
    assert x == [0, 1, 2, 3]
    assert ys == [[1.0, None, 2.0, 3.0], [None, 5.0, None, None]]


def test_many_series_share_two_slots_a_column_and_keep_their_spikes() -> None:
    width, n = 100, 10_000
    columns = []
    for k in range(3):  # each series starts later than the one before: x values all differ
        xs = [k * 7 + 3 * i for i in range(n)]
        ys: list[float | None] = [math.sin(i / 300 + k) for i in range(n)]
        ys[1234 * (k + 1)] = 50.0 + k  # a spike, and a dip, each
        ys[999 * (k + 2)] = -50.0 - k
        columns.append((xs, ys))
    x, out = on_shared_x(columns, width, integral=True)
    assert len(x) == 2 * width and x == sorted(x) and len(set(x)) == len(x)
    assert all(isinstance(v, float) and v == int(v) for v in x)  # whole steps
    column = (x[-1] - x[0]) / width
    for k, ((xs, ys), got) in enumerate(zip(columns, out, strict=True)):
        assert len(got) == 2 * width
        kept = [(slot, y) for slot, y in zip(x, got, strict=True) if y is not None]
        assert {50.0 + k, -50.0 - k} <= {y for _, y in kept}
        for slot, y in kept:  # a real value of the series, drawn within its column
            near = [xi for xi, yi in zip(xs, ys, strict=True) if yi == y]
            assert any(abs(slot - xi) <= column for xi in near)


def test_thinning_refuses_mismatched_or_empty_widths() -> None:
    with pytest.raises(ValueError, match="as many x as y"):
        minmax_buckets([1.0], [], 10)
    with pytest.raises(ValueError, match="at least 1 pixel"):
        minmax_buckets([1.0], [1.0], 0)


def test_secrets_are_masked_at_any_depth() -> None:
    spec = {"environment_variables": {"DB_PASSWORD": "hunter2", "PLAIN": "x", "API_KEY": ""},
            "training": {"hyperparameters": {"wandb_token": "abc", "lr": 0.1}},
            "tags": [["owner", "ann"]]}
    assert masked(spec) == {
        "environment_variables": {"DB_PASSWORD": "****", "PLAIN": "x", "API_KEY": ""},
        "training": {"hyperparameters": {"wandb_token": "****", "lr": 0.1}},
        "tags": [["owner", "ann"]]}


def test_durations_read_as_people_say_them() -> None:
    assert [seconds(v) for v in (None, 0.25, 42, 185, 7620, 3 * 86400 + 3600)] == [
        "", "250 ms", "42 s", "3 m 05 s", "2 h 07 m", "3 d 01 h"]


def test_without_login_the_local_cookie_signs_in_the_local_admin() -> None:
    sessions = Sessions(None, SECRET)
    cookie = sessions.local_cookie(NOW)
    who = sessions.principal(cookie, NOW)
    assert who is not None and (who.user, who.is_admin) == ("local", True)
    assert who.may_change("anyone")
    assert sessions.principal(cookie, NOW + timedelta(hours=13)) is None  # expired
    assert sessions.principal(cookie + "x", NOW) is None  # its signature no longer matches
    assert Sessions(None, b"t" * 32).principal(cookie, NOW) is None  # another secret's
    assert sessions.principal(None, NOW) is None


def test_the_csrf_token_belongs_to_its_cookie() -> None:
    sessions = Sessions(None, SECRET)
    one, other = sessions.local_cookie(NOW), sessions.local_cookie(NOW + timedelta(seconds=1))
    assert sessions.csrf_ok(one, sessions.csrf(one))
    assert not sessions.csrf_ok(one, sessions.csrf(other))
    assert not sessions.csrf_ok(one, None) and not sessions.csrf_ok(None, sessions.csrf(one))


@pytest.fixture
def users(tmp_path: Path) -> Iterator[SqlMetadataStore]:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'shoal.db'}", create=True)
    store.create_user("ann")
    store.create_user("root", is_admin=True)
    yield store
    store.close()


def test_a_token_signs_in_its_user_until_it_is_revoked(users: SqlMetadataStore) -> None:
    sessions = Sessions(users, SECRET)
    made = create_token(users, "ann", "console", scope=Scope.WRITE)
    cookie = sessions.login(made.token, NOW)
    assert made.token not in cookie  # the cookie never holds the token
    who = sessions.principal(cookie, NOW)
    assert who is not None and (who.user, who.is_admin) == ("ann", False)
    assert who.may_change("ann") and not who.may_change("bob")
    users.revoke_token(made.record.id)
    assert sessions.principal(cookie, NOW) is None
    with pytest.raises(AuthenticationError, match="revoked"):
        sessions.login(made.token, NOW)


def test_a_read_token_may_look_but_not_change_and_an_admin_may_change_all(
        users: SqlMetadataStore) -> None:
    sessions = Sessions(users, SECRET)
    reader = sessions.principal(sessions.login(
        create_token(users, "ann", "r", scope=Scope.READ).token, NOW), NOW)
    admin = sessions.principal(sessions.login(
        create_token(users, "root", "a", scope=Scope.ADMIN).token, NOW), NOW)
    assert reader is not None and not reader.may_change("ann")
    assert admin is not None and admin.may_change("ann")
    with pytest.raises(AuthenticationError, match="not known"):
        sessions.login("shoal_nothing", NOW)
    assert sessions.principal(sessions.local_cookie(NOW), NOW) is None  # no such token


@pytest.mark.parametrize("target", ["/jobs", "/jobs/a-b?status=failed&name=x%20y", "/"])
def test_login_returns_to_a_path_inside_the_console(target: str) -> None:
    assert local_path(target) == target


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil",
                                    "/\t/evil.example", "/\n/evil", "jobs", ""])
def test_login_never_redirects_off_the_console(target: str) -> None:
    assert local_path(target) == ""


def test_an_instances_load_is_read_from_the_model_servers_own_metrics() -> None:
    pytest.importorskip("prometheus_client")
    from shoal.serving.metrics import ServerMetrics

    metrics = ServerMetrics(queue_depth=lambda: 2.0, loaded=lambda: 1.0)
    for status, took in ((200, 0.01), (200, 0.01), (500, 0.04)):
        metrics.request(status, took)
    assert load_of(metrics.render().decode()) == {"requests": "3", "latency": "20.0 ms",
                                                  "queue": "2"}
    assert load_of("") == {"requests": "0", "latency": "", "queue": "0"}


def _run(name: str, minute: int, status: RunStatus = RunStatus.COMPLETED,
         **params: object) -> RunRecord:
    return RunRecord("e", name, None, status, NOW + timedelta(minutes=minute),
                     parameters=params)  # type: ignore[arg-type]


def test_runs_filter_and_sort_by_a_parameter_with_missing_ones_last() -> None:
    runs = [_run("a", 0, lr=0.1), _run("b", 1, lr=0.01), _run("c", 2, lr="auto"),
            _run("d", 3), _run("e", 3, RunStatus.FAILED, lr=1)]
    names = lambda found: [r.run_name for r in found]  # noqa: E731
    assert names(select_runs(runs)) == ["e", "d", "c", "b", "a"]  # newest first, ties by order
    assert names(select_runs(runs, sort="param:lr", descending=False)) == ["b", "a", "e", "c",
                                                                            "d"]
    assert names(select_runs(runs, sort="param:lr")) == ["c", "e", "a", "b", "d"]
    assert names(select_runs(runs, status="Failed")) == ["e"]
    assert names(select_runs(runs, name="b", sort="name")) == ["b"]
    with pytest.raises(InvalidArgumentError, match="no run status is called 'done'"):
        select_runs(runs, status="done")
    with pytest.raises(InvalidArgumentError, match="not 'loss'"):
        select_runs(runs, sort="loss")
    last = {"a": 0.5, "b": -2.0, "d": 0.5}  # c and e never logged it
    assert names(select_runs(runs, sort="metric:loss", last=last)) == ["a", "d", "b", "c", "e"]
    assert names(select_runs(runs, sort="metric:loss", descending=False, last=last)) == [
        "b", "a", "d", "c", "e"]
    with pytest.raises(InvalidArgumentError, match="needs the runs' last values"):
        select_runs(runs, sort="metric:loss")


def test_resolved_options_show_values_as_run_their_sources_and_mask_secrets():
    from shoal.console._config import resolved_options
    from shoal.core.jobs import JobName, JobSpec

    spec = JobSpec(name=JobName("j"), instance_type="ml.m5.large", cpus=2.0,
                   environment_variables={"DB_PASSWORD": "hunter2", "MODE": "fast"},
                   tags=(("team", "vision"), ("API_TOKEN", "tok-1")), max_retry_attempts=3,
                   inert_settings={"role": "arn:aws:iam::1:role/x", "s3_kms_key": "k-123"},
                   option_sources={"*": "default", "max_retry_attempts": "explicit argument",
                                   "environment_variables": "user file /u.yaml",
                                   "role": "admin file /a.yaml"})
    rows = {r["option"]: r for r in resolved_options(spec)}
    assert rows["max_retry_attempts"] == {"option": "max_retry_attempts", "value": "3",
                                          "source": "explicit argument"}
    assert rows["environment_variables"]["value"] == "DB_PASSWORD=****, MODE=fast"
    assert rows["environment_variables"]["source"] == "user file /u.yaml"
    assert rows["tags"]["value"] == "team=vision, API_TOKEN=****"
    assert rows["instance_type"]["source"] == "default"
    assert rows["role"] == {"option": "role", "value": "arn:aws:iam::1:role/x",
                            "source": "admin file /a.yaml"}
    assert "k-123" not in str(rows)  # a KMS key id is masked as a secret-looking name
    old = resolved_options(JobSpec(name=JobName("old")))  # recorded before sources were
    assert {r["source"] for r in old} == {"not recorded"}


def test_load_history_turns_scrapes_into_rate_and_latency_per_interval():
    from shoal.console._load import LoadHistory, Sample, sample_of

    history = LoadHistory(size=4, min_interval=1.0)
    a, b = "http://a", "http://b"
    history.record("ep", 100.0, {a: Sample(10, 1.0, 10, 0), b: Sample(0, 0.0, 0, 1)})
    history.record("ep", 100.5, {a: Sample(99, 9.0, 99, 0)})  # too soon after: not kept
    history.record("ep", 102.0, {a: Sample(30, 2.0, 30, 2), b: Sample(20, 3.0, 20, 1)})
    history.record("ep", 104.0, {a: Sample(5, 0.1, 5, 0), b: Sample(20, 3.0, 20, 0)})
    series = history.series("ep")
    assert series["t"] == [102.0, 104.0]
    assert series["rate"] == [20.0, 0.0]  # (20 + 20) / 2 s; then a restarted and b idle
    assert series["latency_ms"][0] == pytest.approx(4.0 / 40 * 1000)
    assert series["latency_ms"][1] is None  # no requests measured in that interval
    assert series["queue"] == [3.0, 0.0]
    for at in (106.0, 108.0, 110.0):  # the ring keeps the last 4 scrapes
        history.record("ep", at, {a: Sample(5, 0.1, 5, 0)})
    assert history.series("ep")["t"] == [106.0, 108.0, 110.0]
    assert history.series("never-seen") == {"t": [], "rate": [], "latency_ms": [], "queue": []}
    sample = sample_of("# HELP x\nshoal_invocations_total{code=\"200\"} 3\n"
                       "shoal_invocations_total{code=\"500\"} 1\n"
                       "shoal_invocation_latency_seconds_sum 0.5\n"
                       "shoal_invocation_latency_seconds_count 4\nshoal_queue_depth 2\n")
    assert sample == Sample(4.0, 0.5, 4.0, 2.0)
