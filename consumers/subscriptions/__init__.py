"""The subscriptions: processors that run on the runtime. Each is a class with its dependencies
as constructor arguments; ``router/wiring/processors.py`` builds them from settings, as the
entry points ``rhumbatron.subscriptions`` name them (docs/processors.md).

The product's four, one package each: ``projector`` (project-view projector), ``causal_router``,
``archive`` (audit archiver), ``analytics`` (analytics projector). ``ledger`` is the runtime's
drill and test subscription, not a product subscription."""
