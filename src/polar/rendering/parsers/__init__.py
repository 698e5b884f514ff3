"""Tool-call and reasoning parsers: sampled text back into content, reasoning and tool calls.

One module per model family, each a :class:`~polar.rendering.parsers.base.ToolParser`; look them
up by name with :func:`polar.rendering.parsers.registry.get_tool_parser`.
"""
