"""The subscriptions: processors that run on the runtime. Each is a class with its dependencies
as constructor arguments; ``router/wiring/processors.py`` builds them from settings by slug.

The product's four, one package each: ``projector`` (project-view projector), ``causal_router``,
``archive`` (audit archiver), ``analytics`` (analytics projector). ``ledger`` is the runtime's
drill and test subscription, not a product subscription."""
