"""A Kubernetes API emulator for testing the controller without a cluster.

``store`` keeps the objects (one resourceVersion counter, bounded watch history) and plays the
cluster's other actors (kubelet, scheduler on demand, node lifecycle and disruption
controllers); ``server`` serves it over real HTTP on 127.0.0.1 as kube-apiserver's REST API, so
the real ``kubernetes_asyncio`` client drives it, optionally enforcing bearer tokens and RBAC
(``auth.Access``, ``rbac``) and telling an observer of every request it answers
(``serve(on_request=...)``); ``cluster`` builds the default two-pool GPU cluster and its
pods. Time comes from an injectable clock (``clock.ManualClock`` in tests).

What it emulates, how closely, and where it differs from kube-apiserver: ``README.md`` here.

```python
clock = ManualClock(datetime(2026, 3, 2, 12, tzinfo=UTC))
store = Store(clock)
cluster.seed(store)
async with serve(store) as url:
    api = client.ApiClient(client.Configuration(host=url))
    ...
    clock.advance(30)   # grace periods end, bookmarks and watch timeouts fire
    store.schedule()    # bind pending pods
```
"""
