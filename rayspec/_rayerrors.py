"""Ray's errors as rayspec's: the one module that reads ``ray.exceptions``.

As httpx's ``map_httpcore_exceptions`` wraps every call into its transport, :func:`map_ray_errors`
wraps rayspec's Ray calls (``ray.get``, ``ray.wait``, ``ray.kill``), and what leaves it is a
rayspec exception (``_exceptions.py``):

=====================================================  ================================
Ray raises                                             rayspec raises
=====================================================  ================================
``RayTaskError`` of a remote rayspec error             that error, unwrapped (its own
                                                       message and attributes, not
                                                       Ray's remote traceback)
``RayActorError`` (``ActorDiedError``, ...)            :class:`ActorLost`
``ActorUnavailableError``                              :class:`ActorLost`, ``unreachable``
``GetTimeoutError``                                    :class:`CallTimeout`
any other ``RayError``                                 :class:`ClusterError` (``unknown``)
=====================================================  ================================

What a lost actor means depends on the caller (a trial asks whether its node died: see
``tune/_site.py``), so a caller may pass ``judge``, which gets the translated error (and Ray's
original as its ``__cause__``) and returns what to raise instead.

Example::

    with map_ray_errors():
        info = ray.get(server.wait_ready.remote())   # ServerStartTimeout, ActorLost, ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import ray

from rayspec._exceptions import ActorLost
from rayspec._exceptions import CallTimeout
from rayspec._exceptions import ClusterError
from rayspec._exceptions import RayspecError

__all__ = ["map_ray_errors", "ray_get", "ray_kill", "ray_message", "translate"]

# Most specific first: the first class an error is an instance of picks its translation.
RAY_EXC_MAP: tuple[tuple[type[Exception], type[ClusterError]], ...] = (
    (ray.exceptions.RayActorError, ActorLost),
    (ray.exceptions.GetTimeoutError, CallTimeout),
    (ray.exceptions.RayError, ClusterError),
)

Judge = Callable[[ClusterError], RayspecError]


def ray_message(exc: BaseException) -> str:
    """An error's own message: Ray wraps remote errors with a traceback and colour codes."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    return str(exc.args[0]) if exc.args else type(exc).__name__


def translate(
    exc: ray.exceptions.RayError, own: tuple[type[RayspecError], ...] = (RayspecError,)
) -> RayspecError:
    """The rayspec error for a Ray error (see the table above).

    Args:
        own: the remote errors raised as themselves; a remote error of another class is a
            failed call like any other (a :class:`ClusterError` with its message).
    """
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, own):
        return cause
    message = ray_message(exc)
    for ray_class, ours in RAY_EXC_MAP:
        if isinstance(exc, ray_class):
            if ours is ActorLost:
                unreachable = isinstance(exc, ray.exceptions.ActorUnavailableError)
                return ActorLost(message, unreachable=unreachable)
            return ours(message)
    return ClusterError(message)


@contextlib.contextmanager
def map_ray_errors(
    judge: Judge | None = None, *, own: tuple[type[RayspecError], ...] = (RayspecError,)
) -> Iterator[None]:
    """Raise a rayspec error for any Ray error raised inside the block.

    Args:
        judge: given the translated :class:`ClusterError` (Ray's error is its ``__cause__``),
            returns the error to raise instead.
        own: the rayspec errors a remote call may raise that are raised as themselves, not
            judged (a trial: only a server's ``LaunchError``; its other remote errors are
            failed calls).
    """
    try:
        yield
    except ray.exceptions.RayError as exc:
        ours = translate(exc, own)
        if not isinstance(ours, ClusterError):  # the remote call's own error
            raise ours from None
        ours.__cause__ = exc
        if judge is not None:
            ours = judge(ours)
        raise ours from exc


def ray_get(ref: Any, *, timeout_s: float | None = None) -> Any:
    """``ray.get(ref)`` through :func:`map_ray_errors`."""
    with map_ray_errors():
        return ray.get(ref, timeout=timeout_s)


def ray_kill(actor: Any) -> None:
    """``ray.kill(actor)``; quiet when Ray cannot (the actor or its node is already gone)."""
    with contextlib.suppress(RayspecError), map_ray_errors():
        ray.kill(actor)
