"""Layer 3, config: what the user asked for, validated once.

The scenario (file + ``PERFSWEEP_*`` environment + flags) and its sections, the URLs a user gives, the objective
(what "better" means), and the searched knobs with the model config they make. Imports only
the layers below it: ``errors``, ``documents`` and ``measure``.
"""
