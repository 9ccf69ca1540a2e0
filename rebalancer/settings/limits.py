"""A pool's safety limits: the numbers ``core.policy.PoolPolicy`` holds every plan to.

Where it sits: ``PoolSettings.limits``; ``PoolSettings.policy`` copies them into the policy.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from rebalancer.settings.values import Duration, PositiveDuration, SettingsBlock


class LimitSettings(SettingsBlock):
    """The safety limits of ``core.policy.PoolPolicy``; defaults as docs/design/safety-rules.md."""

    min_serving: int = Field(default=2, ge=0)
    headroom: float = Field(default=0.2, ge=0, allow_inf_nan=False)
    max_lent_fraction: float = Field(default=1.0, ge=0, le=1)
    min_loan: Duration = timedelta(0)
    unused_loan: Duration = timedelta(minutes=5)
    cooldown: Duration = timedelta(minutes=15)
    max_step_fraction: float = Field(default=0.25, gt=0, le=1)
    staleness: PositiveDuration = timedelta(minutes=2)
    stale_grace: Duration = timedelta(minutes=5)
    queue_limit: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    queue_reclaims: bool = True
    drop_floor: float = Field(default=1 / 3, ge=0, le=1)
    drop_hold: Duration = timedelta(minutes=10)
    reclaim_notice: Duration = timedelta(minutes=5)
    reclaim_deadline: Duration = timedelta(minutes=2)
    warmup: Duration = timedelta(minutes=5)
