"""Engine-specific knowledge, one subpackage per engine, each implementing :class:`t4patch.contract.Engine`.

This package holds no table: which engines exist, in which order, is ``t4patch/commands/engine_table.py``,
read only by the command layer. An engine's modules may import the contract and the generic layers below them
(``t4patch.readiness``, ``t4patch.verify``), never a command.
"""
