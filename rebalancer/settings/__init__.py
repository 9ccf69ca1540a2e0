"""The controller's settings: a YAML file (the Helm chart's ConfigMap) and ``REBALANCER_*`` env.

Where it sits: ``rebalancer run`` calls ``load(path)`` once at start-up and builds every core and
adapter value from the result (``Settings.keys()``, ``PoolSettings.policy(keys)``, ...). Nothing
else reads the environment or the config file.

Sources, later wins:

1. the defaults of the models;
2. the YAML file (``--config PATH`` or ``REBALANCER_CONFIG``), a mapping of the fields below;
3. environment variables ``REBALANCER_<FIELD>``, nested with ``__``
   (``REBALANCER_PROMETHEUS__URL``); a list or mapping is written as JSON
   (``REBALANCER_POOLS='[...]'`` replaces the whole list of pools).

Every invalid value becomes ONE line naming the field path, the value and why, e.g.
``pools[0].window='Mon-Fry 22:00-06:00': has days 'Mon-Fry'; write e.g. Mon-Fri, ...``. All lines
are collected into one ``InvalidSettings`` (a ``ConfigError``; ``lines`` holds them) so that an
operator sees every problem at once; nothing here lets a traceback through for bad input.
Strategies are built once at load time so that their parameters are validated before anything
runs.

One noun a module, from the bottom up:

- ``values``: durations, time zones, names, and ``SettingsBlock``, the base of every block;
- a pool (``pool``) and its blocks: ``taints``, ``queries`` (PromQL), ``limits``, ``strategy``,
  ``slo``, ``wake_on``;
- the controller (``controller``): ``Settings`` and the blocks only it has;
- reading them: ``yaml_file``, ``environment``, ``loader`` (``load``); what is wrong with them,
  a line each: ``problems``.

Callers import this package (``from rebalancer import settings``); every name they use is here.

Reference for every setting: docs/configuration.md.
"""

from rebalancer.settings.controller import (
    AUDIT_SCHEMES,
    AUTHENTICATIONS,
    LOG_LEVELS,
    AlertmanagerSettings,
    AuditSettings,
    HttpSettings,
    LeaderElectionSettings,
    LogLevel,
    Settings,
    TlsSettings,
)
from rebalancer.settings.environment import CONFIG_ENV, ENV_PREFIX
from rebalancer.settings.flags import flag_duration
from rebalancer.settings.limits import LimitSettings
from rebalancer.settings.loader import config_path, load
from rebalancer.settings.pool import CapacitySettings, PoolSettings
from rebalancer.settings.problems import InvalidSettings
from rebalancer.settings.prometheus import (
    PrometheusBasicAuth,
    PrometheusSettings,
    PrometheusTls,
)
from rebalancer.settings.queries import MetricQuerySettings, MetricsSettings
from rebalancer.settings.slo import DEFAULT_SLO, SLO_OFF, SloSettings
from rebalancer.settings.strategy import StrategySettings
from rebalancer.settings.taints import TaintSettings, taint_text
from rebalancer.settings.values import Duration, PositiveDuration, WholeSeconds, Zone
from rebalancer.settings.wake_on import WakeOnSettings
from rebalancer.settings.yaml_file import Unreadable, read_yaml

__all__ = [
    "AUDIT_SCHEMES",
    "AUTHENTICATIONS",
    "CONFIG_ENV",
    "DEFAULT_SLO",
    "ENV_PREFIX",
    "LOG_LEVELS",
    "SLO_OFF",
    "AlertmanagerSettings",
    "AuditSettings",
    "CapacitySettings",
    "Duration",
    "HttpSettings",
    "InvalidSettings",
    "LeaderElectionSettings",
    "LimitSettings",
    "LogLevel",
    "MetricQuerySettings",
    "MetricsSettings",
    "PoolSettings",
    "PositiveDuration",
    "PrometheusBasicAuth",
    "PrometheusSettings",
    "PrometheusTls",
    "Settings",
    "SloSettings",
    "StrategySettings",
    "TaintSettings",
    "TlsSettings",
    "Unreadable",
    "WakeOnSettings",
    "WholeSeconds",
    "Zone",
    "config_path",
    "flag_duration",
    "load",
    "read_yaml",
    "taint_text",
]
