"""`t4patch build`: sm_75 builds from data recipes (``recipes/``): llama.cpp and mistral.rs from their git
repositories, and torch extensions (the Marlin sm_75 library) from a pinned source archive.

The modules, in the order a build uses them: ``recipe`` (load + validate the TOML; ``extension`` holds a torch
extension's sections, its toolchain and its pure steps), ``plan`` (exact commands, directories and environment;
pure, so ``--dry-run`` shows what really runs), ``preflight`` (tools, libraries, disk, nvcc's sm_75 support;
seconds, before anything long), ``runner`` (progress + full log; a batch of commands side by side),
``source`` (resolved commit, verified against the requested ref) and ``sdist`` (an extension's pinned archive),
``pipeline`` (all of it, ending in ``build-record.json``), ``record`` (that record, written typed and read back
as untrusted input), ``artifacts`` (what ``t4patch verify build`` takes from a record) and ``extension_build``
(an extension's cached build, or a build, for the code that loads it). The sm_75 code check itself is
:mod:`t4patch.verify.artifacts.check`.
"""
