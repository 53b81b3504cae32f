"""Environments: the BaseEnv hooks, the small Env class, configuration, runners, registry."""
