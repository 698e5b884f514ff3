"""Model families: how each family's prompts are rendered and its sampled turns read back.

One module per family, each a :class:`~polar.rendering.families.base.Family`; look them up by
name, or detect the served model's, with :mod:`polar.rendering.families.registry`.
"""
