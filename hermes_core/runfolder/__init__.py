"""The run folder: its files, their formats, the lock, the ledger, the spend tally and the indexes.

Every module that reads or writes a run folder goes through this package: the flow
(:mod:`flows.generate`), the prompt dispatcher, the viewer and the export. No Prefect here.
:class:`RunFolder` (:mod:`hermes_core.runfolder.folder`) is the one owner of the folder's file
names: ask it for a file's path instead of spelling the name.
"""

from hermes_core.runfolder.folder import RunFolder

__all__ = ["RunFolder"]
