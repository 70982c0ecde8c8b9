"""Pure logic: no manager, no network (a fixed random source stands in for jitter)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ctrlhub
from ctrlhub import conditions, finalizers
from ctrlhub._config import parse_addr
from ctrlhub._request import RECONCILE_KWARGS, injection
from ctrlhub._timing import Backoff, time_left
from ctrlhub._types import outcome
from ctrlhub.v1 import controller_pb2 as pb

# ---- backoff and deadlines -----------------------------------------------------------------


def test_backoff_doubles_to_its_maximum_with_equal_jitter() -> None:
    low, high = Backoff(0.1, 5.0, rng=lambda: 0.0), Backoff(0.1, 5.0, rng=lambda: 0.999999)
    lows = [round(low.next_delay(False), 3) for _ in range(8)]
    highs = [round(high.next_delay(False), 3) for _ in range(8)]
    assert lows == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5]
    assert highs == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_backoff_resets_after_a_session_that_registered() -> None:
    b = Backoff(0.1, 5.0, rng=lambda: 1.0)
    for _ in range(5):
        b.next_delay(False)
    assert b.failures == 5
    assert b.next_delay(True) == pytest.approx(0.1) and b.failures == 1
    b.next_delay(False)
    assert b.next_delay(True, lasted=0.2) == pytest.approx(0.4) and b.failures == 3, "a flapping session is no reset"


def test_time_left_keeps_a_margin() -> None:
    assert time_left(110.0, 100.0, 60.0) == pytest.approx(9.5)  # 5 % of 10 s is capped at 0.5 s
    assert time_left(102.0, 100.0, 60.0) == pytest.approx(1.9)  # 5 % of 2 s
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
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
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
    (None, "done", "done"),
    (ctrlhub.Done(), "done", "done"),
    (ctrlhub.RequeueAfter(1.5), "requeue", "requeue_after"),
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
        assert result.requeue_after.delay.ToMilliseconds() == 1500
    if isinstance(value, ctrlhub.TemporaryError):
        assert result.error.retry_after.seconds == 3 and result.error.message == "later"
    if value == 42:
        assert "returned 42" in result.error.message


# ---- helpers -------------------------------------------------------------------------------


def test_conditions_keep_transition_time_unless_status_changes() -> None:
    cs: list[dict[str, Any]] = []
    assert conditions.set_condition(cs, "Ready", True, "Ok", "fine", observed_generation=1, now="T1")
    assert not conditions.set_condition(cs, "Ready", True, "Ok", "fine", observed_generation=1, now="T2")
    assert conditions.set_condition(cs, "Ready", True, "Ok", "better", observed_generation=2, now="T3")
    assert cs[0]["lastTransitionTime"] == "T1" and cs[0]["message"] == "better" and cs[0]["observedGeneration"] == 2
    assert conditions.set_condition(cs, "Ready", "Unknown", "Hmm", now="T4")
    assert cs[0]["lastTransitionTime"] == "T4" and "observedGeneration" not in cs[0]
    assert not conditions.is_condition_true(cs, "Ready")
    assert conditions.remove_condition(cs, "Ready") and not conditions.remove_condition(cs, "Ready")
    with pytest.raises(ValueError):
        conditions.set_condition(cs, "Ready", "yes", "r")


def test_finalize_flow() -> None:
    patches: list[dict[str, Any]] = []
    steps: list[str] = []

    def patch(body: dict[str, Any]) -> dict[str, Any]:
        patches.append(body)
        return {"metadata": {"name": "x", "finalizers": body["metadata"]["finalizers"], "resourceVersion": "2"}}

    async def apply(obj: dict[str, Any]) -> ctrlhub.Result:
        steps.append(f"apply {obj['metadata']['resourceVersion']}")
        return ctrlhub.RequeueAfter(60)

    def cleanup(obj: dict[str, Any]) -> None:
        steps.append("cleanup")

    live = {"metadata": {"name": "x", "resourceVersion": "1", "finalizers": ["other"]}}
    assert asyncio.run(finalizers.finalize(live, "ex.com/f", patch, apply=apply, cleanup=cleanup)) == ctrlhub.RequeueAfter(60)
    assert patches == [{"metadata": {"finalizers": ["other", "ex.com/f"], "resourceVersion": "1"}}]
    assert steps == ["apply 2"], "apply sees the stored object"
    deleting = {"metadata": {"name": "x", "resourceVersion": "3", "deletionTimestamp": "t", "finalizers": ["other", "ex.com/f"]}}
    assert asyncio.run(finalizers.finalize(deleting, "ex.com/f", patch, apply=apply, cleanup=cleanup)) is None
    assert steps[-1] == "cleanup" and patches[-1] == {"metadata": {"finalizers": ["other"], "resourceVersion": "3"}}
    gone = {"metadata": {"deletionTimestamp": "t", "finalizers": ["other"]}}
    assert asyncio.run(finalizers.finalize(gone, "ex.com/f", patch, apply=apply, cleanup=cleanup)) == ctrlhub.Done()
    assert len(patches) == 2


def test_traceparent_child() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    child = ctrlhub.traces.child_traceparent(parent)
    assert child.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and child.endswith("-01")
    assert child.split("-")[2] != "00f067aa0ba902b7" and len(child.split("-")[2]) == 16
    assert ctrlhub.traces.child_traceparent("") == "" and ctrlhub.traces.child_traceparent("junk") == ""


def test_the_package_is_typed() -> None:
    """mypy --strict over the package (its config is in pyproject.toml)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"), str(root / "src" / "ctrlhub")],
                          capture_output=True, text=True, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
