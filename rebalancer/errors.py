"""The project's one error tree.

```
RebalancerError
├── ConfigError        a setting, parameter or command-line value is invalid
├── TraceError         a trace file cannot be read (names the file, line and field)
├── StoreFailed        the audit store did not take a write or answer a read, for a reason of its
│                      own (adapters.audit): the only error the runtime reads as "the store fails"
└── WriteError         the API server refused a write or kept failing (adapters.writer)
    ├── Conflict       409: the object changed since it was read; never retried
    ├── NotFound       404
    ├── ApiFailure     anything else, or a transient failure that outlasted the retries
    └── NotServed      the cluster serves no EvictionRequest API (adapters.evictionrequests)
```

Decisions never raise: a refusal is a ``core.model.Rejection`` value and bad annotations are
``core.overrides.Problem`` values. These exceptions are for the edges, where a person must fix
an input before anything can run.

Every error line that repeats a value a person gave shows it with ``shown``: a value pasted by
mistake (a whole file in an environment variable, a 5,000-character template) is cut to its
first characters and its length, so the line stays one line a person can read.
"""

SHOWN_CHARACTERS = 80


def shown(value: object) -> str:
    """``value`` as an error line quotes it (``repr``), cut after ``SHOWN_CHARACTERS``:
    ``'abc…' (5000 characters)``."""
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[:SHOWN_CHARACTERS]}… ({length} characters)"


class RebalancerError(Exception):
    """Base of every error the project raises on purpose."""


class ConfigError(RebalancerError):
    """A setting, strategy parameter or command-line value is invalid."""


class TraceError(RebalancerError):
    """A load trace cannot be read; the message names the file, the line and the field."""


class StoreFailed(RebalancerError):
    """The audit store did not take a write or answer a read, for a reason of its own: a full
    or read-only disk, a database server down, refusing or timing out, a lost connection.
    ``adapters.audit.AuditLog`` raises it from the store's error (its ``__cause__``), and the
    runtime reads only this as "the store fails" (docs/design/audit-failure.md): anything else
    raised on the way to the store is a bug of ours, and goes up as it is."""
