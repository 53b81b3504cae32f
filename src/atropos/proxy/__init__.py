"""The rollout proxy: OpenAI- and Anthropic-compatible endpoints that turn any agent program
into token-exact training data.

An agent that only knows a base URL and a key talks to the proxy; each of its calls goes to the
policy through the inference layer (`atropos.inference`), and the session it belongs to keeps the
token ids and logprobs of everything generated (`atropos.proxy.session`). See docs/proxy.md.
"""
