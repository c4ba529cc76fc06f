"""An example team's own subscriptions for Rhumbatron:

- ``acme-task-counts`` (:mod:`acme_processors.counts`): completed and failed tasks per project,
  a Redis hash;
- ``acme-task-history`` (:mod:`acme_processors.history`): one row per task event in a
  ``task_history`` table of the team's PostgreSQL;
- ``acme-failure-alerts`` (:mod:`acme_processors.alerts`) and the handler ``acme-notify``
  (:mod:`acme_processors.notify`): an alert for each failed task, sent to a service outside
  every transaction, as a command the handler carries out.
"""
