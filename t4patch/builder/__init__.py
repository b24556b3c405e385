"""`t4patch build`: sm_75 builds of llama.cpp and mistral.rs from data recipes (``recipes/*.toml``).

The modules, in the order a build uses them: ``recipe`` (load + validate the TOML), ``plan`` (exact
commands, directories and environment; pure, so ``--dry-run`` shows what really runs), ``preflight`` (tools,
libraries, disk, nvcc's sm_75 support; seconds, before anything long), ``runner`` (progress + full log),
``source`` (resolved commit, verified against the requested ref), ``artifacts`` (the sm_75 code check, also
behind ``t4patch verify build``) and ``pipeline`` (all of it, ending in ``build-record.json``).
"""
