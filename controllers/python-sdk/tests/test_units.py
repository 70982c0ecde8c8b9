"""Pure logic: no manager, no network (a fixed random source stands in for jitter)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ctrlhub
import pytest
from ctrlhub import conditions
from ctrlhub._attempt import time_left
from ctrlhub._backoff import Backoff
from ctrlhub._config import parse_addr
from ctrlhub._fence import Fence, Verdict, Watchdog
from ctrlhub._request import RECONCILE_KWARGS, injection
from ctrlhub._types import outcome
from ctrlhub.v1 import controller_pb2 as pb

# ---- the helper semantics every SDK shares (tests/conformance/helpers.json) ----------------

HELPERS = json.loads((Path(__file__).resolve().parents[3] / "tests" / "conformance" / "helpers.json").read_text())


def _named(section: str) -> Any:
    cases = HELPERS[section]
    assert cases, f"helpers.json has {section} cases"
    return pytest.mark.parametrize("case", cases, ids=[c.get("name", str(i)) for i, c in enumerate(cases)])


@_named("conditions")
def test_shared_conditions(case: dict[str, Any]) -> None:
    cs: list[dict[str, Any]] = json.loads(json.dumps(case["given"]))
    for i, step in enumerate(case["steps"]):
        if "remove" in step:
            changed = conditions.remove_condition(cs, step["remove"])
        else:
            c = step["set"]
            changed = conditions.set_condition(cs, c["type"], c["status"], c["reason"], c.get("message", ""),
                                               observed_generation=c.get("observedGeneration"), now=step["now"])
        assert changed == step["changed"], f"step {i}"
    assert cs == case["want"]
    assert [c["type"] for c in cs if conditions.is_condition_true(cs, c["type"])] == case["true"]


@_named("finalizers")
def test_shared_finalizers(case: dict[str, Any]) -> None:
    obj, name = case["object"], case["finalizer"]
    assert ctrlhub.finalizers.has_finalizer(obj, name) == case["has"]
    assert ctrlhub.finalizers.is_deleting(obj) == case["deleting"]
    assert ctrlhub.finalizers.step(obj, name) == case["step"]
    assert ctrlhub.finalizers.add_patch(obj, name) == case["add_patch"]
    assert ctrlhub.finalizers.remove_patch(obj, name) == case["remove_patch"]


@_named("backoff")
def test_shared_backoff(case: dict[str, Any]) -> None:
    low = Backoff(case["initial_ms"] / 1000, case["max_ms"] / 1000, rng=lambda: 0.0)
    high = Backoff(case["initial_ms"] / 1000, case["max_ms"] / 1000, rng=lambda: 1.0)
    for i, session in enumerate(case["sessions"]):
        assert low.next_delay(session["registered"]) * 1000 == pytest.approx(session["min_ms"], abs=1), f"session {i}"
        assert high.next_delay(session["registered"]) * 1000 == pytest.approx(session["max_ms"], abs=1), f"session {i}"


@_named("deadline")
def test_shared_deadline(case: dict[str, Any]) -> None:
    remaining = case["remaining_ms"] / 1000
    assert time_left(100.0 + remaining, 100.0, 60.0) * 1000 == pytest.approx(case["run_ms"], abs=1e-6)


# ---- deadlines ----------------------------------------------------------------------------


def test_time_left_without_a_deadline_or_past_it() -> None:
    """Python's own cases of the deadline margin (the shared ones are in helpers.json)."""
    assert time_left(99.0, 100.0, 60.0) == 0.0  # already past
    assert time_left(None, 100.0, 60.0) == pytest.approx(59.5)  # no deadline: the fallback


# ---- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("addr,want", [
    ("127.0.0.1:9090", ("127.0.0.1:9090", False)),
    ("http://127.0.0.1:9090", ("127.0.0.1:9090", False)),
    ("https://ctrlhub.svc:443/", ("ctrlhub.svc:443", True)),
    ("HTTP://[::1]:9090", ("[::1]:9090", False)),
])
def test_addresses_with_or_without_a_scheme(addr: str, want: tuple[str, bool]) -> None:
    assert parse_addr(addr) == want


@pytest.mark.parametrize("addr,says", [
    ("127.0.0.1", "no port"),
    ("grpc://h:1", "scheme must be http:// or https://"),
    ("h:http", "is not a number"),
    ("h:0", "is not a number from 1 to 65535"),
    ("::1:9090", "IPv6 host in brackets"),
    ("http://h:1/path", "expected host:port"),
    ("", "expected host:port"),
])
def test_bad_addresses_are_explained(addr: str, says: str) -> None:
    with pytest.raises(ctrlhub.ConfigError, match=says):
        ctrlhub.Config(addr=addr)


def test_token_file_is_checked_and_read_on_every_call(tmp_path: Path) -> None:
    with pytest.raises(ctrlhub.ConfigError, match="token file .*missing.* does not exist"):
        ctrlhub.Config(token_file=tmp_path / "missing")
    token = tmp_path / "token"
    token.write_text("one\n")
    c = ctrlhub.Config(token_file=token)
    assert c.authorization() == "Bearer one"
    token.write_text("two")
    assert c.authorization() == "Bearer two"
    token.unlink()
    with pytest.raises(ctrlhub.ConfigError, match="cannot read token file"):
        c.authorization()


def test_tls_settings() -> None:
    with pytest.raises(ctrlhub.ConfigError, match="needs its key"):
        ctrlhub.TLS(cert_file=Path("c.pem"))
    with pytest.raises(ctrlhub.ConfigError, match="use https://"):
        ctrlhub.Config(addr="http://h:1", tls=ctrlhub.TLS())
    assert ctrlhub.Config(addr="h:1", tls=ctrlhub.TLS()).secure
    assert ctrlhub.Config(addr="https://h:1").secure


def test_from_env(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("tok")
    c = ctrlhub.Config.from_env({"CTRLHUB_ADDR": "https://m:9090", "CTRLHUB_TOKEN_FILE": str(tmp_path / "t"),
                                 "CTRLHUB_TLS_CA_FILE": "ca.pem", "CTRLHUB_TLS_SERVER_NAME": "ctrlhub"})
    assert (c.target, c.secure, c.authorization()) == ("m:9090", True, "Bearer tok")
    assert c.tls == ctrlhub.TLS(ca_file=Path("ca.pem"), server_name="ctrlhub")
    assert ctrlhub.Config.from_env({}).authorization() == "Bearer dev"


def test_run_exits_with_a_clear_error_on_a_bad_address(tmp_path: Path) -> None:
    script = tmp_path / "c.py"
    script.write_text("import ctrlhub\n@ctrlhub.reconcile('v1/ConfigMap')\nasync def c(key): pass\nctrlhub.run()\n")
    env = {**os.environ, "CTRLHUB_ADDR": "localhost"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "invalid manager address 'localhost': no port" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- definitions ---------------------------------------------------------------------------


def test_kinds() -> None:
    assert ctrlhub.Kind.parse("v1/ConfigMap") == ctrlhub.Kind("", "v1", "ConfigMap")
    assert str(ctrlhub.Kind.parse("apps/v1/Deployment")) == "apps/v1/Deployment"
    with pytest.raises(ValueError, match="expected version/Kind"):
        ctrlhub.Kind.parse("ConfigMap")


def test_registration() -> None:
    op = ctrlhub.Operator()

    @op.reconcile("apps/v1/Deployment", namespaces=["a", "b"], labels={"x": "y"}, max_concurrent=4,
                  owns=["apps/v1/ReplicaSet"], watches=[ctrlhub.Watch("v1/ConfigMap", label="ctrlhub.io/rollout")],
                  predicate=ctrlhub.Predicate.generation_changed() | ~ctrlhub.Predicate.deleting(),
                  deadline=30, resync=0, backoff=(0.01, 10))
    def roll_out_things(key: ctrlhub.Key) -> None:
        pass

    reg = op.controllers[0].to_register()
    assert reg.controller_name == "roll-out-things" and reg.mode == reg.MODE_RECONCILE
    assert (reg.primary.group, reg.primary.kind) == ("apps", "Deployment")
    assert list(reg.namespaces.names.names) == ["a", "b"] and dict(reg.label_selector.match_labels) == {"x": "y"}
    assert reg.max_in_flight == 4 and not reg.include_object
    assert reg.owns[0].resource.kind == "ReplicaSet" and reg.owns[0].controller_only
    assert reg.watches[0].label_key == "ctrlhub.io/rollout"
    assert reg.predicate.any_of.predicates[1].negate.HasField("deleting")
    assert reg.request_deadline.seconds == 30 and reg.HasField("resync_period") and reg.resync_period.seconds == 0
    assert reg.backoff.base.nanos == 10_000_000
    with pytest.raises(ValueError, match="already declared"):
        op.reconcile("v1/ConfigMap", name="roll-out-things")(roll_out_things)


def test_the_definition_keywords_are_declared_once_and_checked() -> None:
    """``Options`` is the one declaration of the 13 keywords (their types and docs): the
    decorators and ``Controller`` take ``Unpack[Options]`` and ``Definition`` holds them; an
    unknown one is refused, and on_event refuses the reconcile-only ones."""
    import dataclasses
    import typing

    assert len(ctrlhub.Options.__annotations__) == 13
    assert [f.name for f in dataclasses.fields(ctrlhub.Definition)] == ["name", "kind", "mode", "options"]
    for fn in (ctrlhub.Operator.reconcile, ctrlhub.Operator.on_event, ctrlhub.Controller.__init__, ctrlhub.Definition.of):
        kwargs = typing.get_type_hints(fn)["options"]
        assert typing.get_args(kwargs) == (ctrlhub.Options,), fn.__qualname__
    d = ctrlhub.Definition.of("x", "v1/ConfigMap", owns=["apps/v1/Deployment"], deadline=5)
    assert d.options["owns"] == (ctrlhub.Owns("apps/v1/Deployment"),) and d.deadline_seconds == 5 and d.credit == 1
    with pytest.raises(TypeError, match="unknown controller option"):
        ctrlhub.Definition.of("x", "v1/ConfigMap", max_concurrency=2)  # type: ignore[call-arg]
    op = ctrlhub.Operator()
    with pytest.raises(TypeError, match="an event handler takes no owns"):
        op.on_event("v1/ConfigMap", owns=["apps/v1/Deployment"])(lambda key: None)
    with pytest.raises(TypeError, match="unknown controller option.* max_concurency"):
        ctrlhub.Controller("x", "v1/ConfigMap", lambda key: None, max_concurency=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="max_concurrent must be at least 1"):
        op.reconcile("v1/ConfigMap", max_concurrent=0)(lambda key: None)


def test_handler_arguments_are_checked_when_declared() -> None:
    with pytest.raises(TypeError, match="unknown parameter 'objekt'"):
        injection(lambda key, objekt: None, RECONCILE_KWARGS, "reconcile handler")
    with pytest.raises(TypeError, match="positional-only"):
        injection(lambda key, /: None, RECONCILE_KWARGS, "reconcile handler")
    wanted, needs_object = injection(lambda key, extra=1, **kw: None, RECONCILE_KWARGS, "h")
    assert needs_object and {n for n, _ in wanted} == set(RECONCILE_KWARGS)
    wanted, needs_object = injection(lambda name, namespace: None, RECONCILE_KWARGS, "h")
    assert not needs_object and [n for n, _ in wanted] == ["name", "namespace"]


@pytest.mark.parametrize("value,label,field", [
    (None, "success", "done"),
    (ctrlhub.Done(), "success", "done"),
    (ctrlhub.RequeueAfter(1.5), "requeue_after", "requeue_after"),
    (ctrlhub.RequeueAfter(0), "requeue", "requeue_after"),
    (ctrlhub.TemporaryError("later", delay=3), "error", "error"),
    (ctrlhub.PermanentError("bad spec"), "terminal", "terminal"),
    (KeyError("x"), "error", "error"),
    (42, "error", "error"),
])
def test_outcomes(value: Any, label: str, field: str) -> None:
    result = pb.ReconcileResult(id="1")
    assert outcome(result, value) == label
    assert result.WhichOneof("outcome") == field
    if isinstance(value, ctrlhub.RequeueAfter):
        assert result.requeue_after.delay.ToMilliseconds() == value.delay * 1000
    if isinstance(value, ctrlhub.TemporaryError):
        assert result.error.retry_after.seconds == 3 and result.error.message == "later"
    if value == 42:
        assert "returned 42" in result.error.message


# ---- helpers -------------------------------------------------------------------------------


def test_condition_status_is_checked() -> None:
    """Python's own: a status that is no bool nor True/False/Unknown is refused."""
    with pytest.raises(ValueError):
        conditions.set_condition([], "Ready", "yes", "r")


def _fake_patch(patches: list[dict[str, Any]]) -> Any:
    def patch(obj: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        patches.append(body)
        rv = str(int(obj["metadata"].get("resourceVersion", "0")) + 1)
        return {"metadata": {"name": "x", "finalizers": body["metadata"]["finalizers"], "resourceVersion": rv}}

    return patch


def test_sync_finalizers_ensure_and_finalize() -> None:
    patches: list[dict[str, Any]] = []
    steps: list[str] = []
    f = ctrlhub.SyncFinalizers(_fake_patch(patches), lambda coro: asyncio.run(coro))
    live = {"metadata": {"name": "x", "resourceVersion": "1", "finalizers": ["other"]}}
    assert not f.finalize(live, "ex.com/f", lambda o: steps.append("cleanup")), "not deleting: nothing to clean"
    assert f.ensure(live, "ex.com/f") and not f.ensure(live, "ex.com/f")
    assert patches == [{"metadata": {"finalizers": ["other", "ex.com/f"], "resourceVersion": "1"}}]
    assert live["metadata"] == {"name": "x", "resourceVersion": "2", "finalizers": ["other", "ex.com/f"]}, "obj refreshed in place"
    deleting = {"metadata": {"name": "x", "resourceVersion": "3", "deletionTimestamp": "t", "finalizers": ["other", "ex.com/f"]}}
    assert not f.ensure(deleting, "ex.com/g"), "no new finalizer on a deleting object"
    assert f.finalize(deleting, "ex.com/f", lambda o: steps.append(f"cleanup {o['metadata']['resourceVersion']}"))
    assert steps == ["cleanup 3"] and patches[-1] == {"metadata": {"finalizers": ["other"], "resourceVersion": "3"}}
    assert not f.finalize(deleting, "ex.com/f", lambda o: steps.append("again")), "the finalizer is gone: done"

    async def async_cleanup(o: dict[str, Any]) -> None:
        steps.append("async cleanup")

    again = {"metadata": {"name": "x", "resourceVersion": "5", "deletionTimestamp": "t", "finalizers": ["ex.com/f"]}}
    assert f.finalize(again, "ex.com/f", async_cleanup) and steps[-1] == "async cleanup", "an async cleanup from a sync handler"
    with pytest.raises(RuntimeError):
        f.finalize({"metadata": {"deletionTimestamp": "t", "finalizers": ["ex.com/f"]}}, "ex.com/f",
                   lambda o: (_ for _ in ()).throw(RuntimeError("external system down")))
    assert len(patches) == 3, "a failed cleanup keeps the finalizer"


async def test_async_finalizers_run_a_sync_cleanup_off_the_event_loop() -> None:
    patches: list[dict[str, Any]] = []
    threads: list[str] = []
    sync_patch = _fake_patch(patches)

    async def patch(obj: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        return sync_patch(obj, body)  # type: ignore[no-any-return]

    from ctrlhub._request import blocking

    f = ctrlhub.Finalizers(patch, blocking)
    loop_thread = threading.current_thread().name
    deleting = {"metadata": {"name": "x", "resourceVersion": "3", "deletionTimestamp": "t", "finalizers": ["ex.com/f"]}}
    assert await f.finalize(deleting, "ex.com/f", lambda o: threads.append(threading.current_thread().name))
    assert threads and threads[0] != loop_thread, "a sync cleanup never runs on the event loop"
    assert patches == [{"metadata": {"finalizers": [], "resourceVersion": "3"}}]
    live = {"metadata": {"name": "y", "resourceVersion": "1"}}
    assert await f.ensure(live, "ex.com/f") and live["metadata"]["finalizers"] == ["ex.com/f"]


def test_traceparent_child() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    child = ctrlhub.traces.child_traceparent(parent)
    assert child.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and child.endswith("-01")
    assert child.split("-")[2] != "00f067aa0ba902b7" and len(child.split("-")[2]) == 16
    assert ctrlhub.traces.child_traceparent("") == "" and ctrlhub.traces.child_traceparent("junk") == ""


def test_the_package_is_typed(tmp_path: Path) -> None:
    """mypy --strict over the installed package (its config is in pyproject.toml), copied with
    its generated stubs, which a wheel build never writes into src/."""
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(Path(ctrlhub.__file__).parent, tmp_path / "ctrlhub", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                           str(tmp_path / "ctrlhub")], capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- exclusive attempts: the fence ---------------------------------------------------------


def test_the_anchor_is_when_the_last_answered_heartbeat_was_sent() -> None:
    fence = Fence(hold=2.0, interval=0.4, since=100.0)
    assert fence.anchor is None and fence.age(100.5) == 0.5, "before the first echo the fence counts from Registered"
    one, two, three = fence.beat(100.0), fence.beat(100.4), fence.beat(100.8)
    assert fence.answered(two) and fence.anchor == 100.4
    assert not fence.answered(one), "an older nonce than an answered one is forgotten"
    assert not fence.answered(99), "an unknown nonce is ignored"
    assert fence.answered(three) and fence.anchor == 100.8
    assert fence.age(101.0) == pytest.approx(0.2)


def test_half_the_hold_expires_a_live_session_and_80_percent_ends_a_running_handler() -> None:
    fence = Fence(hold=2.0, interval=0.4, since=0.0)
    fence.answered(fence.beat(10.0))
    assert fence.verdict(10.99) is Verdict.OK
    assert fence.verdict(11.0) is Verdict.EXPIRE
    fence.expired = True
    assert fence.verdict(11.5) is Verdict.OK, "expired once"
    assert fence.verdict(11.6) is Verdict.OK, "nothing runs: nothing to stop"
    fence.running = 1
    assert fence.verdict(11.55) is Verdict.OK and fence.verdict(11.65) is Verdict.EXIT
    ended = Fence(hold=2.0, interval=0.4, since=0.0)
    ended.answered(ended.beat(10.0))
    ended.live, ended.running = False, 1
    assert ended.verdict(11.2) is Verdict.OK, "an ended session is not expired again"
    assert ended.verdict(11.65) is Verdict.EXIT and not ended.done()
    ended.running = 0
    assert ended.done()


def test_the_watchdog_expires_once_and_exits_for_a_handler_that_outlives_the_hold() -> None:
    exits: list[str] = []
    expired: list[float] = []
    dog = Watchdog("unit", exit=exits.append)
    t0 = time.monotonic()
    fence = Fence(hold=0.5, interval=0.1, since=t0)
    fence.running = 1  # a handler that never returns, and a manager that never answers
    dog.watch(fence, "s-1", lambda: expired.append(time.monotonic()))
    while not exits and time.monotonic() < t0 + 10:
        time.sleep(0.01)
    exited = time.monotonic()
    dog.stop()
    assert len(expired) == 1 and expired[0] - t0 >= 0.25, "not before half the hold"
    assert exited - t0 >= 0.4, "not before 80 % of the hold"
    assert len(exits) == 1 and "1 handler(s) of session s-1 still running" in exits[0] and "exits now (status 70)" in exits[0]


# ---- requests without an object ------------------------------------------------------------


def _request(**fields: Any) -> ctrlhub.Request:
    msg = pb.ReconcileRequest(id="r1", attempt=1, **fields)
    msg.key.namespace, msg.key.name = "ns", "n"
    return ctrlhub.Request(msg, None, logging.getLogger("unit"))


def test_a_missing_or_empty_object_is_not_found_and_an_empty_tombstone_still_a_deletion() -> None:
    none = _request()
    assert none.object is None and none.tombstone is None
    empty = _request(object_json=b"")
    assert empty.object is None and empty.tombstone is None, "an empty object is no state: NotFound"
    tomb = _request(tombstone=pb.Tombstone(object_json=b""))
    assert tomb.object is None and tomb.tombstone == {}, "the manager saw the deletion, without a last state"
    kwargs = {name: get(tomb) for name, get in RECONCILE_KWARGS.items() if name not in ("reader", "deadline", "events")}
    assert kwargs["obj"] is None and kwargs["meta"] == {} and kwargs["spec"] == {}
    with pytest.raises(ctrlhub.TemporaryError, match="not valid JSON"):
        _ = _request(object_json=b"{nope").object  # the manager's fault, never Terminal


# ---- registration: revisions, children, exclusive attempts ---------------------------------


def test_revision_from_the_option_or_ctrlhub_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    op = ctrlhub.Operator()
    op.reconcile("v1/ConfigMap", name="from-env")(lambda key: None)
    op.reconcile("v1/ConfigMap", name="pinned", revision=7)(lambda key: None)
    env_ctrl, pinned = op.controllers
    monkeypatch.delenv("CTRLHUB_REVISION", raising=False)
    assert env_ctrl.to_register().revision == 0
    monkeypatch.setenv("CTRLHUB_REVISION", "3")
    assert env_ctrl.to_register().revision == 3 and pinned.to_register().revision == 7
    monkeypatch.setenv("CTRLHUB_REVISION", "v2")
    with pytest.raises(ctrlhub.ConfigError, match="CTRLHUB_REVISION='v2': the revision must be a whole number"):
        env_ctrl.to_register()


def test_children_in_full_unless_metadata_only_and_attempts_exclusive() -> None:
    op = ctrlhub.Operator()
    op.reconcile("example.ctrlhub.io/v1/Website", name="w",
                 owns=["apps/v1/Deployment", ctrlhub.Owns("v1/Service", metadata_only=True)],
                 watches=[ctrlhub.Watch("v1/Secret", label="site", metadata_only=True)])(lambda key: None)
    op.on_event("v1/ConfigMap", name="e")(lambda key: None)
    reg, events = (c.to_register() for c in op.controllers)
    assert [o.metadata_only for o in reg.owns] == [False, True] and reg.watches[0].metadata_only
    assert reg.exclusive_attempts, "reconcile sessions fence their attempts"
    assert not events.exclusive_attempts, "an event has no answer that confirms a cancelled attempt"


def test_metadata_only_kinds_are_read_as_metadata() -> None:
    lease = ctrlhub.Kind("coordination.k8s.io", "v1", "Lease")
    reader = ctrlhub.Reader(None, ctrlhub.Config(), "s", {lease: "metadata"})  # type: ignore[arg-type]
    assert reader.form("coordination.k8s.io/v1/Lease") == "metadata" and reader.form("v1/Secret") is None
    with pytest.raises(ctrlhub.MetadataOnlyError, match="use|get_metadata"):
        asyncio.run(reader.get(lease, "ns", "x"))
    meta = ctrlhub.ObjectMetadata.of({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {
        "name": "x", "namespace": "ns", "labels": {"a": "b"}, "ownerReferences": [{"kind": "Website", "name": "w"}],
        "resourceVersion": "7", "finalizers": ["f"], "generation": 2}})
    assert (meta.name, meta.namespace, meta.labels, meta.resource_version, meta.generation) == ("x", "ns", {"a": "b"}, "7", 2)
    assert meta.owner_references[0]["name"] == "w" and meta.finalizers == ["f"] and meta.deletion_timestamp is None
    assert ctrlhub.ObjectMetadata.of({}).labels == {}, "no metadata: empty, never an exception"


def test_a_name_held_by_another_identity_is_asked_for_again_not_fatal() -> None:
    """docs/protocol.md: ALREADY_EXISTS before Registered means another identity of the tenant
    holds the name; the replica waits (every ``outdated_retry``) instead of exiting, while the
    refusals only a human can fix stay fatal."""
    import grpc
    from ctrlhub._session import _classify

    end = _classify(grpc.StatusCode.ALREADY_EXISTS, "held by system:serviceaccount:team-a:ctl", registered=False)
    assert end.retry and end.held and not end.outdated, end
    assert "system:serviceaccount:team-a:ctl" in end.reason
    with pytest.raises(ctrlhub.FatalError):
        _classify(grpc.StatusCode.PERMISSION_DENIED, "no", registered=False)
