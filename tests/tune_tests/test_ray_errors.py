"""The Ray boundary (``rayspec/_rayerrors.py``): every Ray error leaves as a rayspec error, and a
trial's site judges what an actor error means (node lost, actor lost, or neither). No cluster:
Ray's exceptions are built as Ray builds them, and the node table is patched."""

from __future__ import annotations

import inspect

import pytest
import ray.exceptions

from rayspec import FailureReason
from rayspec import LaunchError
from rayspec import RayspecError
from rayspec._exceptions import ActorLost
from rayspec._exceptions import CallTimeout
from rayspec._exceptions import ClusterError
from rayspec._exceptions import NodeLost
from rayspec._rayerrors import map_ray_errors
from rayspec._rayerrors import translate
from rayspec.tune import _site
from rayspec.tune._site import TrialSite


def _remote(cause: Exception) -> ray.exceptions.RayTaskError:
    """A remote call's error as ``ray.get`` raises it (a class deriving from both)."""
    return ray.exceptions.RayTaskError("f", "Traceback (remote) ...", cause).as_instanceof_cause()


def _raised(exc: BaseException, **kwargs: object) -> BaseException:
    with pytest.raises(BaseException) as info, map_ray_errors(**kwargs):  # type: ignore[arg-type]
        raise exc
    return info.value


def test_every_ray_error_class_leaves_as_a_rayspec_error() -> None:
    """As httpx checks that every httpcore exception is mapped."""
    classes = [
        c for c in vars(ray.exceptions).values()
        if inspect.isclass(c) and issubclass(c, ray.exceptions.RayError)
    ]  # fmt: skip
    assert len(classes) > 10
    for cls in classes:
        exc = cls.__new__(cls)  # no constructor is shared; the class picks the translation
        exc.args = ("it failed",)
        assert isinstance(translate(exc), ClusterError), cls


@pytest.mark.parametrize(
    ("exc", "cls", "reason"),
    [
        (ray.exceptions.ActorDiedError(), ActorLost, FailureReason.ACTOR_LOST),
        (ray.exceptions.RayActorError(), ActorLost, FailureReason.ACTOR_LOST),
        (ray.exceptions.GetTimeoutError("Get timed out"), CallTimeout, FailureReason.UNKNOWN),
        (ray.exceptions.RaySystemError("gcs"), ClusterError, FailureReason.UNKNOWN),
        (_remote(ValueError("bad value")), ClusterError, FailureReason.UNKNOWN),
    ],
    ids=["actor-died", "actor-error", "get-timeout", "system", "remote-bug"],
)
def test_a_ray_error_is_translated(exc: Exception, cls: type, reason: FailureReason) -> None:
    err = _raised(exc)
    assert type(err) is cls and err.reason is reason  # type: ignore[attr-defined]
    assert err.__cause__ is exc  # Ray's own error stays attached


def test_an_unreachable_actor_is_lost_and_says_so() -> None:
    err = translate(ray.exceptions.ActorUnavailableError("unreachable", None))
    assert isinstance(err, ActorLost) and err.unreachable
    assert not translate(ray.exceptions.ActorDiedError()).unreachable  # type: ignore[attr-defined]


def test_a_remote_rayspec_error_leaves_as_itself() -> None:
    own = LaunchError("out of memory at startup", reason=FailureReason.OUT_OF_MEMORY)
    err = _raised(_remote(own))
    assert err is own and str(err) == "out of memory at startup"  # not Ray's traceback


def test_a_remote_error_not_owned_is_a_failed_call_and_judged() -> None:
    from rayspec import BenchError

    seen: list[ClusterError] = []

    def judge(err: ClusterError) -> RayspecError:
        seen.append(err)
        return err

    launch = LaunchError("exited", reason=FailureReason.STARTUP_CRASH)
    assert _raised(_remote(launch), judge=judge, own=(LaunchError,)) is launch
    err = _raised(_remote(BenchError("flush failed")), judge=judge, own=(LaunchError,))
    assert type(err) is ClusterError and str(err) == "flush failed" and seen == [err]


def test_other_errors_pass_untouched() -> None:
    exc = KeyError("not ray's")
    assert _raised(exc) is exc


class _Cluster:
    """ray.nodes() as a trial's site sees it: which nodes are alive."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, alive: set[str]) -> None:
        self.alive = alive
        monkeypatch.setattr(_site, "node_alive", lambda nid: nid in self.alive)
        monkeypatch.setattr(_site, "alive_nodes", lambda: {n: f"10.0.0.9 {n}" for n in self.alive})
        monkeypatch.setattr(_site, "_ACTOR_DEATH_WAIT_S", 0.0)
        monkeypatch.setattr(_site, "_NODE_DEATH_WAIT_S", 0.0)


def _site_on(node: str, *, stopping: bool = False, gone: bool = False) -> TrialSite:
    return TrialSite(
        alive_at_start={node: f"10.0.0.9 {node}"}, stopping=lambda: stopping,
        server_gone=lambda: gone, node_id=node, node=f"10.0.0.9 {node}",
    )  # fmt: skip


def test_an_actor_error_on_a_dead_node_is_node_lost(monkeypatch) -> None:
    _Cluster(monkeypatch, alive=set())
    err = _site_on("n1").judge(translate(ray.exceptions.ActorDiedError()))
    assert isinstance(err, NodeLost) and err.reason is FailureReason.NODE_LOST
    assert err.node == "10.0.0.9 n1" and "died mid-trial" in str(err)


def test_a_node_dead_before_the_trial_knew_it_is_named(monkeypatch) -> None:
    _Cluster(monkeypatch, alive=set())
    site = _site_on("n1")
    site.node_id = site.node = ""  # still being placed
    err = site.judge(translate(ray.exceptions.ActorDiedError()))
    assert isinstance(err, NodeLost) and err.node == "10.0.0.9 n1"


def test_an_actor_error_on_a_live_node_is_actor_lost(monkeypatch) -> None:
    _Cluster(monkeypatch, alive={"n1"})
    err = _site_on("n1").judge(translate(ray.exceptions.ActorDiedError()))
    assert type(err) is ActorLost and err.reason is FailureReason.ACTOR_LOST
    assert str(err).startswith("the Ray worker process of the trial's server actor died")


def test_another_error_with_the_server_actor_gone_is_actor_lost(monkeypatch) -> None:
    _Cluster(monkeypatch, alive={"n1"})
    err = _site_on("n1", gone=True).judge(translate(ray.exceptions.RaySystemError("x")))
    assert type(err) is ActorLost


def test_nothing_is_judged_while_the_driver_stops(monkeypatch) -> None:
    _Cluster(monkeypatch, alive=set())
    err = _site_on("n1", stopping=True).judge(translate(ray.exceptions.ActorDiedError()))
    assert type(err) is ClusterError and err.reason is FailureReason.UNKNOWN
