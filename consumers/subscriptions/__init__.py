"""The subscriptions: processors that run on the runtime. Each is a class with its dependencies
as constructor arguments; ``router/wiring/processors.py`` builds them from settings by slug."""
