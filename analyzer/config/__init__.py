"""Layer 3, config: what the user asked for, validated once.

The scenario (file + ``PERFSWEEP_*`` environment + flags: ``scenario``) and its sections
(``sections``), the URLs a user gives (``urls``), the objective, what "better" means
(``objective``), and the searched knobs with the model config they make (``knobs``). Imports
only the layers below it: ``errors``, ``documents`` and ``measure``.
"""
