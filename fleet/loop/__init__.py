"""The agent loop: one trace's turns, from a model call to its tool calls and back.

Owns the runner, its turns and steps (`decide_next`), tool calls, resuming after a crash or
a child, what the model sees besides the conversation (`context`), fitting a request into
the context window (`fit`) and structured answers (`structured`).
"""
