"""Layer 3, config: what the user asked for, validated once.

The scenario (file + ``PERFSWEEP_*`` environment + flags: ``scenario``) and its sections
(``sections``), the URLs a user gives (``urls``), the objective, what "better" means
(``objective``), the searched knobs (``knobs``), how they are read from and written into a
model config (``model_config``) and which values each is searched over (``choices``). Imports
only the layers below it: ``errors``, ``documents`` and ``measure``.
"""
