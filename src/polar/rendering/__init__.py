"""Gateway-side rendering: chat templates, prompt splicing with sampled ids, tool-call parsers.

With ``render: gateway`` the gateway turns each normalized request into prompt token ids itself
(the served model's tokenizer and chat template), puts the exact sampled ids of this session's
earlier completions where a re-rendering would otherwise go, calls the engine with token ids,
and parses the sampled text back into content, reasoning and tool calls. Every prompt then
extends the previous one exactly, so merged traces are the contexts the engine really saw.
"""
