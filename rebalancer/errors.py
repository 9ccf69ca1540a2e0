"""The project's one error tree.

```
RebalancerError
├── ConfigError        a setting, parameter or command-line value is invalid
├── TraceError         a trace file cannot be read (names the file, line and field)
└── WriteError         the API server refused a write or kept failing (adapters.writer)
    ├── Conflict       409: the object changed since it was read; never retried
    ├── NotFound       404
    └── ApiFailure     anything else, or a transient failure that outlasted the retries
```

Decisions never raise: a refusal is a ``core.model.Rejection`` value and bad annotations are
``core.overrides.Problem`` values. These exceptions are for the edges, where a person must fix
an input before anything can run.
"""


class RebalancerError(Exception):
    """Base of every error the project raises on purpose."""


class ConfigError(RebalancerError):
    """A setting, strategy parameter or command-line value is invalid."""


class TraceError(RebalancerError):
    """A load trace cannot be read; the message names the file, the line and the field."""
