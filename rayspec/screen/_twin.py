"""The NCCL screen answered by the twin's NCCL model (``server.engine: twin``).

Same interface as the GPU microbenchmark: each set is resolved the way the twin server resolves
its environment (so a typo fails at communicator init, an algorithm list with nothing usable
fails at the first collective, P2P on a broken platform hangs), then priced at each size.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from collections.abc import Sequence

from rayspec.screen._base import BaseNcclScreen
from rayspec.screen._base import ScreenResult
from rayspec.screen._base import ScreenStatus
from rayspec.screen._base import env_key

__all__ = ["TwinNcclScreen"]


class TwinNcclScreen(BaseNcclScreen):
    """Rank NCCL sets by the twin's all-reduce model of one profile.

    Args:
        profile: a twin profile name or YAML path (as ``server.twin.profile``).

    Example::

        screen = TwinNcclScreen("kimi-k2.5-tp8-pcie")
        [r] = screen.measure([{"NCCL_PROTO": "LL"}], [14336], timeout_s=60)
        r.latency_at(14336)   # 38.2
    """

    def __init__(self, profile: str) -> None:
        from rayspec.twin import load_profile

        self.profile_name = profile
        self.profile = load_profile(profile)

    def measure(
        self,
        envs: Sequence[Mapping[str, str]],
        sizes_bytes: Sequence[int],
        *,
        timeout_s: float,
    ) -> list[ScreenResult]:
        from rayspec.twin import NcclError
        from rayspec.twin import resolve_nccl

        del timeout_s  # the model answers at once; a hang is a property of the set
        sizes = sorted(set(int(s) for s in sizes_bytes))
        out: list[ScreenResult] = []
        for env in envs:
            t0 = time.perf_counter()
            nccl_env = {k: v for k, v in env.items() if k.startswith("NCCL_")}
            key = env_key(nccl_env)
            try:
                setup = resolve_nccl(nccl_env, self.profile)
                if setup.hang:
                    out.append(
                        ScreenResult(
                            key, ScreenStatus.HANG, detail="the first all-reduce never returned"
                        )
                    )
                    continue
                latency = tuple((s, float(setup.allreduce_us(s))) for s in sizes)
            except NcclError as exc:
                detail = f"{exc.reason.value}: {str(exc).splitlines()[0] if str(exc) else ''}"
                out.append(ScreenResult(key, ScreenStatus.ERROR, detail=detail))
                continue
            out.append(ScreenResult(key, ScreenStatus.OK, latency,
                                    elapsed_s=time.perf_counter() - t0))  # fmt: skip
        return out

    def describe(self) -> str:
        return f"the twin's NCCL model (profile {self.profile_name})"
