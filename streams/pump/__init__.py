"""The feed pump (docs/pump.md): an upstream NDJSON change feed into the streams.

- ``identity``: the corpus id and history lineage a feed answers with, and the version 1
  checkpoint bound to them;
- ``page``: one page of the feed checked line by line, and its events cut into batches;
- ``pump``: the run (identity first, then each batch and its checkpoint in one transaction);
- ``kafka``: the transactional publisher of batches and checkpoints, and the checkpoint reader;
- ``http``: the feed over HTTP (httpx); ``reference_server``: the feed the demo and tests serve.
"""
