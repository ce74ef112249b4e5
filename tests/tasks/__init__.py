"""Tests of the DAG's task modules (``tasks/``) that stand on their own; most tasks are tested through the flow
(``tests/flows/``)."""
