"""The run folder: its files, their formats, the lock, the ledger, the spend tally and the indexes.

Every module that reads or writes a run folder goes through this package: the flow
(:mod:`flows.generate`), the prompt dispatcher, the viewer and the export. No Prefect here.
"""
