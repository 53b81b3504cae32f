"""The inference layer: clients for OpenAI-compatible servers, routing, token-exact sessions."""
